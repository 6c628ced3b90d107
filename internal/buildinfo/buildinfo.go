// Package buildinfo says which llmq a program is: the module version it
// was built from and, for a build from a checkout, the commit, so that
// `--version` answers what a bug report needs.
package buildinfo

import (
	"cmp"
	"runtime/debug"
	"strings"
)

// String is the version line of program: "llmq dispatcher v1.2.0 (go1.26.0)"
// for a released module, or "(devel)" with the commit and its time for a
// build from a checkout, "+dirty" when the checkout had changes.
func String(program string) string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return program + " (unknown version: built without module information)"
	}
	return format(program, bi, Version, Commit)
}

// Version and Commit are set at link time by a build without the
// repository's history (the Dockerfile: -ldflags "-X
// github.com/llmq/llmq/internal/buildinfo.Version=… -X ….Commit=…"); a
// build from a checkout or a released module needs neither.
var Version, Commit string

// format is String of bi, with the version and commit stamped at link
// time (empty when none was).
func format(program string, bi *debug.BuildInfo, stampVersion, stampCommit string) string {
	version := bi.Main.Version
	if version == "" || version == "(devel)" {
		version = cmp.Or(stampVersion, "(devel)")
	}
	rev, at := stampCommit, ""
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	var b strings.Builder
	b.WriteString(program + " " + version)
	if rev != "" && !strings.Contains(version, rev[:min(12, len(rev))]) {
		b.WriteString(" commit " + rev[:min(12, len(rev))])
		if dirty {
			b.WriteString("+dirty")
		}
		if at != "" {
			b.WriteString(" (" + at + ")")
		}
	} else if version == "(devel)" {
		b.WriteString(" (built without version control information: the Dockerfile's LLMQ_VERSION and LLMQ_COMMIT stamp it)")
	}
	if bi.GoVersion != "" {
		b.WriteString(", " + bi.GoVersion)
	}
	return b.String()
}
