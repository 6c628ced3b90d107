package limiter

import (
	"embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

const (
	// lagDelay is how far back the total a bucket took is read for a
	// reservation: reservations made up to this long before a call may
	// reach the provider after it, so Settle counts them as possibly
	// missing from the provider's answer.
	lagDelay = 50 * time.Millisecond
	// learnTTL is how long a scope's hash outlives its last use once it
	// holds what the scope learned: a scope idle overnight starts the
	// morning with what it knew.
	learnTTL = 24 * time.Hour
	// drainBelief is how long after the provider's last answer the drain
	// it showed is assumed to go on.
	drainBelief = 3 * time.Second
	// How fast a limit factor lowered by unpredicted 429s, and a burst
	// lowered by 429s that showed a shorter window, come back: a fraction
	// of the limit (of the burst window) per minute.
	factorRecovery = 0.05
	burstRecovery  = 0.1
)

// The token bucket's scripts are their own Lua file after four preludes, in
// this order: luaConstants, the clock (redisclock.Lua), stateLua and
// bucketLua.
func bucketScript(file string) *redis.Script {
	return redis.NewScript(luaConstants + redisclock.Lua + stateLua + bucketLua + lua(file))
}

// luaConstants defines, as Lua locals, the package's constants the token
// bucket's scripts use, so that each is defined once, here in Go.
var luaConstants = luaPrelude([]luaConstant{
	{"INFLIGHT_GEN", inflightGen},
	{"LAG_DELAY", lagDelay},
	{"LEARN_TTL", learnTTL},
	{"DRAIN_BELIEF", drainBelief},
	{"FACTOR_RECOVERY", factorRecovery / float64(time.Minute.Microseconds())},
	{"BURST_RECOVERY", burstRecovery / float64(time.Minute.Microseconds())},
	{"FACTOR_DECREASE", factorDecrease},
	{"FACTOR_COOLDOWN", factorCooldown},
	{"FACTOR_FLOOR", factorFloor},
	{"DRAIN_MIN_SPAN", drainMinSpan},
	{"DRAIN_MAX", drainMax},
	{"BUSY_SHARE", busyShare},
	{"REFUND_WINDOW", refundWindow},
	{"DISTRUST_AFTER", distrustAfter},
	{"DISTRUST_WINDOW", distrustWindow},
	{"DISTRUST_FOR", distrustFor},
	{"CALIBRATION_SAMPLES", calibrationSamples},
	{"MIN_CALIBRATION_SAMPLES", minCalibrationSamples},
	{"SAMPLE_MIN", sampleBounds[0]},
	{"SAMPLE_MAX", sampleBounds[1]},
	{"RECALIBRATION", recalibration},
	{"REFUSALS_KEPT", refusalsKept},
	{"BURST_DECREASE", burstDecrease},
	{"BURST_MIN", burstMin},
	{"SHORT_DECREASE", shortDecrease},
	{"ESTIMATE_MIN", estimateMin},
	{"ESTIMATE_SAFETY", estimateSafety},
	{"PACE_MAX", paceMax},
	{"PACE_MIN", paceMin},
	{"PACE_SPARE", paceSpare},
	{"PACE_STEP", paceStep},
	{"PACE_GROWTH", paceGrowth / float64(time.Second.Microseconds())},
	{"PACE_HOLD", paceHold},
	{"STATUS_DENIED", statusDenied},
	{"STATUS_ALLOWED", statusAllowed},
	{"STATUS_PROBE", statusProbe},
	{"STATUS_PENALTY", statusPenalty},
	{"STATUS_PROBE_WAIT", statusProbeWait},
	{"MODE_HOLD", modeReserveHold},
	{"MODE_PREFETCH", modeReservePrefetch},
	{"MODE_STATE", modeState},
})

// luaConstant is one Go constant as a script sees it: the Lua local name.
type luaConstant struct {
	name  string
	value any // a time.Duration (given in µs), a number or a plain string
}

// luaPrelude returns a line `local NAME = value` per constant.
func luaPrelude(cs []luaConstant) string {
	var b strings.Builder
	b.WriteString("-- the limiter's constants (lua.go); times in µs, rates per µs\n")
	for _, c := range cs {
		v := fmt.Sprint(c.value)
		switch x := c.value.(type) {
		case time.Duration:
			v = strconv.FormatInt(x.Microseconds(), 10)
		case float64:
			v = strconv.FormatFloat(x, 'g', -1, 64)
		case string:
			v = "'" + x + "'"
		}
		fmt.Fprintf(&b, "local %s = %s\n", c.name, v)
	}
	return b.String()
}

// stateLua reads and writes a scope's state, a table of named values in
// one field of its hash; bucketLua holds the functions the token bucket's
// scripts share.
var stateLua, bucketLua = lua("state.lua"), lua("bucket.lua")

//go:embed *.lua
var luaFiles embed.FS

func lua(name string) string {
	b, err := luaFiles.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}
