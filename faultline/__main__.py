from faultline.cli import main

main()
