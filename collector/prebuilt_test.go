package collector

import (
	"testing"

	"github.com/offcpu/offcpu/internal/testenv"
)

// runBuild builds a test program, or takes it prebuilt (testenv.Build).
func runBuild(t testing.TB, name string, args ...string) {
	t.Helper()
	testenv.Build(t, name, args...)
}
