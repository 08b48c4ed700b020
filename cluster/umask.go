package cluster

import "syscall"

// umask sets the process umask and returns the old one, so the API socket is
// never briefly reachable by others between creation and chmod.
func umask(m int) int { return syscall.Umask(m) }
