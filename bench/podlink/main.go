// Command podlink links what mesh's Podman client links (mesh/podman, and
// through it Podman's Go bindings) and does nothing else: it starts, runs the
// packages' initialisation, says ready and sleeps until killed.
// bench/memory.sh prints its RSS beside the agent's, as the share of the
// agent's idle memory that comes with the bindings alone.
package main

import (
	"os"
	"os/signal"
	"syscall"

	_ "mesh/podman"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	os.Stdout.WriteString("ready\n") // every package is initialised by now
	<-c
}
