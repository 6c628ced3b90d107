// Package redisclock is the one source of time of llmq's Lua scripts: Redis
// TIME, so that every process agrees on limits and budget days whatever its
// own clock says, or a clock that tests inject, passed to the script as its
// ARGV[1] in microseconds.
package redisclock

import (
	_ "embed" // the clock prelude, clock.lua
	"strconv"
	"time"
)

// Lua starts a script (clock.lua): it sets the local now, in µs since the
// Unix epoch, from ARGV[1] when that is a number, else from Redis TIME.
// A script begins with it (after any constants of its own) and takes its
// arguments from ARGV[2] on.
//
//go:embed clock.lua
var Lua string

// Arg is a script's ARGV[1]: clock's time in µs, or "" (Redis TIME) when
// clock is nil.
func Arg(clock func() time.Time) string {
	if clock == nil {
		return ""
	}
	return strconv.FormatInt(clock().UnixMicro(), 10)
}
