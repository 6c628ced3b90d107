package limiter

import (
	_ "embed" // the scripts' Lua, in the .lua files beside their callers
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/redisclock"
)

// lagDelay is how far back the total a bucket took is read for a
// reservation (lag_of in bucket.lua): reservations made up to this long
// before a call may reach the provider after it, and Settle counts them as
// possibly missing from the provider's answer.
const lagDelay = 50 * time.Millisecond

// learnTTL is how long a scope's hash outlives its last use once it holds
// what the scope learned (drain, limit factor, calibration): a scope idle
// overnight starts the morning with what it knew.
const learnTTL = 24 * time.Hour

// drainBelief is how long after the provider's last answer the drain it
// showed is assumed to go on.
const drainBelief = 3 * time.Second

// factorRecovery is how fast a limit factor lowered by unpredicted 429s
// comes back, as a fraction of the limit per minute.
const factorRecovery = 0.05

// burstRecovery is how fast a burst lowered by 429s that showed a shorter
// window comes back, as a fraction of the burst window per minute.
const burstRecovery = 0.1

// The token bucket's scripts (reserve.lua, settle.lua, inspect.lua) are
// their own Lua after four preludes, in this order: luaConstants, the clock
// (redisclock.Lua, which sets now), stateLua and bucketLua.
func bucketScript(body string) *redis.Script {
	return redis.NewScript(luaConstants + redisclock.Lua + stateLua + bucketLua + body)
}

// luaConstants defines, as Lua locals, the package's constants the
// token bucket's scripts use, so that each is defined once, here in Go.
// Times are in µs, and the rates per µs.
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
	value any // a time.Duration (given in µs), float64, int or plain string
}

var (
	luaName     = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)
	plainString = regexp.MustCompile(`^[A-Za-z0-9_ ]*$`)
)

// luaPrelude returns a line `local NAME = value` per constant.
func luaPrelude(cs []luaConstant) string {
	var b strings.Builder
	b.WriteString("-- the limiter's constants (lua.go); times in µs, rates per µs\n")
	seen := map[string]bool{}
	for _, c := range cs {
		if !luaName.MatchString(c.name) || seen[c.name] {
			panic(fmt.Sprintf("limiter: Lua constant name %q is invalid or given twice", c.name))
		}
		seen[c.name] = true
		var v string
		switch x := c.value.(type) {
		case time.Duration:
			v = strconv.FormatInt(x.Microseconds(), 10)
		case float64:
			v = strconv.FormatFloat(x, 'g', -1, 64)
		case int:
			v = strconv.Itoa(x)
		case string:
			if !plainString.MatchString(x) {
				panic(fmt.Sprintf("limiter: Lua constant %s: string %q needs escaping", c.name, x))
			}
			v = "'" + x + "'"
		default:
			panic(fmt.Sprintf("limiter: Lua constant %s: unsupported type %T", c.name, x))
		}
		fmt.Fprintf(&b, "local %s = %s\n", c.name, v)
	}
	return b.String()
}

// stateLua reads and writes a scope's state (state.lua): load_state,
// save_state and put. The state is a table of named values kept in the one
// field m of the scope's hash (rkeys.LimiterScope), as MessagePack, or as
// JSON where Redis has no cmsgpack. A run reads it and writes it once, and
// its numbers stay numbers, exact. A field per value cost a Lua string for
// each name and value read and a number formatted for each written: half of
// the reserve script's time in Redis (docs/BENCHMARKS.md, "The limiter's
// state in one field"). load_state reads the older forms (a field per
// value; the calibration's samples as strings q and qs) as the current one,
// and the first run that writes rewrites them.
//
// The state's fields, each named as Redis holds it (renaming one would lose
// what existing scopes hold). Times are in µs since the epoch; <name> is a
// bucket's name ("rpm", "tpm"); a factor or share is a fraction of 1.
//
// The penalty and the probe (Penalize, and the Reserve after it):
//
//	pu                  the end of the penalty
//	pid, pt             the probe's reservation id, and its deadline
//
// A bucket's level (Reserve, Reconcile, Settle):
//
//	u:<name>, t:<name>  the tokens it holds used, and when they were counted
//	g:<name>            its in-flight generation (see inflightGen)
//	f0:<name>           what is reserved and not yet reconciled in generation g
//	f1:<name>           the same in generation g - 1
//	c:<name>            all it ever took
//	cl:<name>, clt:<name>  c after the latest run that took, and when
//	kn:<name>, knt:<name>  the newer checkpoint of c, and when
//	k:<name>, kt:<name>    the older checkpoint, at least lagDelay before
//	                    (the three give what it took lagDelay ago, see lagDelay)
//	pace:<name>, pace_t:<name>  what its pace held, and when (see Bucket.Burst)
//
// What Settle learns from the provider's answers, so that the next runs
// see it at once (it must change in the same run that settles):
//
// The provider's view of the bucket:
//
//	pr:<name>, prt:<name>  what the provider last said it holds, and when
//	                    (BucketLearning.ProviderRemaining)
//	s:<name>            the lag (see lagDelay) of the freshest answer followed:
//	                    an older answer only ever lowers the level
//
// Others' drain (BucketSettlement.Drain) and the refund estimate
// (BucketLearning.Refund), from the corrections the provider's answers
// make while its bucket is busy (busyShare):
//
//	e:<name>            the share of the refill others take, believed for
//	                    drainBelief after the last answer (the drain)
//	n:<name>            the corrections' sum, forgotten over refundWindow
//	tw:<name>           the time that sum covers, forgotten alike
//	w:<name>            the tokens calls left unused, forgotten alike
//	wa:<name>           the unused tokens since the last answer added
//	ls:<name>           when the last answer came
//	lb:<name>           "1" when it showed the provider's bucket busy (and
//	                    was trusted): the next answer adds to the sums
//	lim:<name>          the limit the sums are of: they start again with a
//	                    new one
//
// The limit factor after unpredicted 429s (BucketSettlement.Factor):
//
//	x:<name>, xt:<name> the share of its limit the bucket may use, and when
//	                    a 429 lowered it (factorDecrease; it comes back at
//	                    factorRecovery)
//	zt:<name>           when the last 429 that lowered it came, and
//	zc:<name>, zr:<name>  c and rr then: what was let through between two
//	                    429s bounds the provider's rate (estimateMin)
//	rr:<name>           the tokens of every call the provider refused
//	rf:<name>           the last refusalsKept calls it refused, as
//	                    "place:cost,...", place being c just before the call
//
// Short windows (BucketSettlement.BurstFactor, BucketLearning.PaceFactor):
//
//	bf:<name>, bt:<name>  the share of its burst window the bucket lets out
//	                    at once, and when a 429 lowered it (burstDecrease;
//	                    it comes back at burstRecovery)
//	pace_m:<name>, pace_mt:<name>  the pace's rate over the bucket's, and
//	                    when it last changed (paceGrowth, paceMax, paceMin)
//	pace_hold:<name>    until when that factor stays at most 1 (paceHold)
//
// The distrust of the provider's counts (ScopeLearning.Distrusted):
//
//	hd                  until when its counts never lower the buckets
//	hn, hnt             the unpredicted 429s counted, and since when
//	                    (distrustAfter within distrustWindow)
//
// The calibration (Calibration):
//
//	qa                  the last calibrationSamples prompt ratios, in the
//	                    order they came, clamped to sampleBounds and kept to
//	                    four decimals
//	qm, qn              their median, and how many there are
//	q, qs               the older form of qa: fixed-width records ('%07.4f',
//	                    comma separated), in arrival order and sorted; read
//	                    once, and dropped by the first run that writes
//
// And:
//
//	l                   "1" once the scope learned anything: its hash then
//	                    lives at least learnTTL
//
//go:embed state.lua
var stateLua string

// bucketLua holds the functions the token bucket's scripts share
// (bucket.lua): a bucket's level, capacity and rate as learned
// (load_bucket), its in-flight amounts, the totals it took a moment ago
// (lag_of, put_lag) and the hash's expiry.
//
//go:embed bucket.lua
var bucketLua string
