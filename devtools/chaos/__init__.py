"""The chaos suite: faultline's closed loop under a steady load of faults while its parts are killed,
restarted, cut off and slowed down, measured against ground truth (`make chaos`, reduced in
tests/integration/test_chaos.py).

    plan      the scenarios and their seeded schedules (pure)
    audit     the API server's audit policy and the actions counted from its log
    fleet     the node agents and the four workers as real `faultline` processes
    truth     what every node should look like at the end, and what was lost or done twice
    harness   the environment (control plane, FerretDB, proxies, cloud fake) and one scenario's run
"""
