// Package testenv holds helpers shared by the project's tests.
package testenv

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RequireRoot skips a test that needs root for eBPF, unless
// OFFCPU_REQUIRE_BPF=1 says this machine must run it (CI does). With
// -short it is skipped whoever runs it: go test -short ./... is the tier
// that needs neither root nor the servers the recordings run.
func RequireRoot(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the tier without root")
	}
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("OFFCPU_REQUIRE_BPF") == "1" {
		t.Fatal("OFFCPU_REQUIRE_BPF=1 but not running as root: run the tests as root")
	}
	t.Skip("needs root for eBPF (set OFFCPU_REQUIRE_BPF=1 to make this a failure)")
}

// JDKHomes returns the JDKs to test unmodified JVMs on, by feature
// version: Debian's 17 (CI installs it: a failure when missing there) and
// a 25 when one is installed.
func JDKHomes(t testing.TB) map[string]string {
	t.Helper()
	homes := map[string]string{}
	for ver, dir := range map[string]string{"17": "/usr/lib/jvm/java-17-openjdk-amd64", "25": "/usr/lib/jvm/temurin-25-jdk-amd64"} {
		if _, err := os.Stat(dir + "/bin/javac"); err == nil {
			homes[ver] = dir
		}
	}
	if homes["17"] == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("no JDK 17 at /usr/lib/jvm/java-17-openjdk-amd64: .ci/run installs openjdk-17-jdk-headless")
		}
		t.Skip("no JDK 17 at /usr/lib/jvm/java-17-openjdk-amd64")
	}
	return homes
}

// Scale is OFFCPU_TEST_SCALE (default 1): how much longer a test should
// record where the machine is slow, as a kernel emulated by qemu is
// (tools/kmatrix sets it there).
func Scale() int {
	if n, err := strconv.Atoi(os.Getenv("OFFCPU_TEST_SCALE")); err == nil && n > 1 {
		return n
	}
	return 1
}

// Chromium is the headless browser the viewer tests drive: skipped when
// absent, failed with OFFCPU_REQUIRE_BROWSER=1 (CI).
func Chromium(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("OFFCPU_REQUIRE_BROWSER") == "1" {
		t.Fatal("OFFCPU_REQUIRE_BROWSER=1 but no chromium: apt-get install chromium")
	}
	t.Skip("chromium not installed (apt-get install chromium); set OFFCPU_REQUIRE_BROWSER=1 to fail instead")
	return ""
}

// RunChromium runs headless Chromium offline with args: its stdout and
// stderr (its console's log).
func RunChromium(t testing.TB, bin string, args ...string) (string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--enable-logging=stderr", "--v=0", "--user-data-dir=" + t.TempDir()}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	return stdout.String(), stderr.String()
}
