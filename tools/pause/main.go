// Command pause holds a pod's namespaces open: it sleeps until SIGINT or SIGTERM and exits 0. It is PID 1 of
// every pod sandbox on the local cluster's real nodes, where no registry is reachable to pull the upstream
// pause image; built static (no cgo) and put in an image FROM scratch by devtools/realnode_images.py.
// Orphaned processes that it inherits as PID 1 are reaped on SIGCHLD.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
