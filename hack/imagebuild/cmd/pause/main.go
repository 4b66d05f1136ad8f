//go:build linux

// Command pause is the sandbox (pause) container of the local test node's
// pods, doing what the upstream registry.k8s.io/pause does: it holds the
// pod's namespaces open as PID 1, reaps the zombies of any process that
// ends up re-parented to it (with a shared PID namespace every container's
// orphans come here), and exits 0 on SIGINT or SIGTERM, which is how the
// runtime stops a sandbox. It is built here rather than pulled because no
// registry is reachable on the project's machines.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (hcp-operator hack/imagebuild)")
		return
	}
	if os.Getpid() != 1 {
		// Upstream warns the same way: outside a PID namespace it cannot
		// reap the pod's orphans, but it still holds the namespaces.
		fmt.Fprintln(os.Stderr, "pause: warning: not running as PID 1")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		switch sig {
		case syscall.SIGCHLD:
			reap()
		default:
			fmt.Fprintf(os.Stderr, "pause: shutting down, got signal: %s\n", sig)
			os.Exit(0)
		}
	}
}

// reap collects every exited child without blocking. Signals coalesce, so
// one SIGCHLD may stand for several children: loop until none is left.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
