package cluster

import (
	"testing"

	"mesh/internal/testutil"
)

func freePort(t testing.TB) int { return testutil.FreePort(t) }
