package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		bi   debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v1.2.0"}},
			"llmq v1.2.0, go1.26.0"},
		{debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			"llmq (devel) commit 0123456789ab+dirty (2026-12-01T10:00:00Z), go1.26.0"},
		// A pseudo-version already names the commit.
		{debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261201100000-0123456789ab"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123"}}},
			"llmq v0.0.0-20261201100000-0123456789ab"},
		{debug.BuildInfo{Main: debug.Module{}}, "llmq (devel) (built without version control information: the Dockerfile's LLMQ_VERSION and LLMQ_COMMIT stamp it)"},
	} {
		if got := format("llmq", &c.bi, "", ""); got != c.want {
			t.Errorf("format(%+v) = %q, want %q", c.bi, got, c.want)
		}
	}
	// An image's build has no history: the version and commit come from
	// the Dockerfile's build arguments.
	image := debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "(devel)"}}
	if got, want := format("llmq", &image, "v0.9.0", "0123456789abcdef"), "llmq v0.9.0 commit 0123456789ab, go1.26.0"; got != want {
		t.Errorf("stamped = %q, want %q", got, want)
	}
	// The test binary itself has build information.
	if got := String("x"); !strings.HasPrefix(got, "x ") || !strings.Contains(got, "go1.") {
		t.Errorf("String = %q", got)
	}
}
