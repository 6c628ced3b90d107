package limiter

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

func mustSettle(t *testing.T, tb *TokenBucket, r *Reservation, fb Feedback) *Settlement {
	t.Helper()
	s, err := tb.Settle(context.Background(), r, fb)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func tpmOf(s *Settlement) BucketSettlement {
	for _, b := range s.Buckets {
		if b.Name == "tpm" {
			return b
		}
	}
	return BucketSettlement{}
}

// Settle never gives tokens back on llmq's own say: a provider that keeps
// max_tokens charged (as OpenAI documents) is never overtaken. What the
// provider charged beyond the reservation is taken. Reconcile, for permits
// whose cost is exact, still refunds.
func testSettleNeverRefunds(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("keep", 0, 100, 10_000, 0, 0)
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 1000}) // 200 prompt + 800 max_tokens
	st := mustSettle(t, tb, r.Reservation, Feedback{Unused: Cost{Tokens: 700}})
	if !st.Applied || tpmOf(st).Level != 1000 {
		t.Fatalf("settle %+v: the unused 700 must stay counted", st)
	}
	if got := remaining(mustState(t, tb, s)); got["tpm"] != 9000 {
		t.Fatalf("remaining %v, want tpm 9000", got)
	}
	// The provider counted 300 more prompt tokens than the reservation.
	r = mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 1000})
	mustSettle(t, tb, r.Reservation, Feedback{Charged: Cost{Requests: 1, Tokens: 1300}})
	if got := remaining(mustState(t, tb, s)); got["tpm"] != 7700 {
		t.Fatalf("remaining %v, want tpm 7700 (1300 charged)", got)
	}
	// Settling again changes nothing.
	if st := mustSettle(t, tb, r.Reservation, Feedback{Charged: Cost{Requests: 1, Tokens: 5000}}); st.Applied {
		t.Fatalf("second settle applied: %+v", st)
	}
	if got := remaining(mustState(t, tb, s)); got["tpm"] != 7700 {
		t.Fatalf("remaining %v after a second settle, want 7700", got)
	}
}

// A bucket follows the provider's view both ways: up when the provider has
// used more (another client, another tokenizer), down when it has used less
// (it refunded), counting what was reserved here since a moment before the
// call, which the provider's answer may not show yet.
func testSettleFollowsProvider(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("follow", 0, 0, 10_000, 0, 0)
	x := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 1000}).Reservation
	e.clock.Add(time.Second) // past the lag: what follows is after x
	y := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 500}).Reservation
	// When it answered x, the provider had 6,000 left: it had used 4,000
	// (3,000 by someone else). y, reserved after x, may not be in it.
	st := mustSettle(t, tb, x, Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: 6000, Limit: 10_000}}})
	b := tpmOf(st)
	// 1,500 used, less one second of refill (166.67) = 1,333 by the model;
	// bound 4,000 + 1,500 (x and y, taken since x's lag).
	if b.Model != 1333 || b.ProviderBound != 5500 || b.Level != 5500 {
		t.Fatalf("after x: %+v, want model 1333, bound and level 5500", b)
	}
	// y's answer: the provider refunded and had 9,000 left: the bucket comes
	// down to what it has used, plus what was taken since y's lag (y alone).
	st = mustSettle(t, tb, y, Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: 9000, Limit: 10_000}}})
	if b := tpmOf(st); b.Level != 1500 {
		t.Fatalf("after y: %+v, want level 1500", b)
	}
	// An answer older than one already followed only ever lowers.
	z := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100}).Reservation
	z.lag = []int64{0}
	if b := tpmOf(mustSettle(t, tb, z, Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: 0}}})); b.Level != b.Model {
		t.Fatalf("a stale answer raised the bucket: %+v", b)
	}
}

// Without an answer about a bucket (no headers, a per-day bucket), the
// bucket keeps its own count.
func testSettleWithoutHeaders(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("noheaders", 0, 100, 10_000, 1_000_000, 0)
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 1000}).Reservation
	st := mustSettle(t, tb, r, Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: 9500}}})
	for _, b := range st.Buckets {
		want := int64(1000)
		if b.Name == "rpm" {
			want = 1
		}
		if b.Name == "tpm" {
			want = 1500
		}
		if b.Level != want || (b.Name != "tpm" && b.ProviderBound != -1) {
			t.Errorf("%s: %+v, want level %d", b.Name, b, want)
		}
	}
}

// While the provider's bucket is busy, a steady excess of its count over
// this bucket's (another application on the account) is learned as a drain:
// the bucket refills that much slower, and the next answers agree with it.
func testSettleLearnsDrain(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	const limit = 60_000 // 1,000 tokens a second
	s := modelScope("drain", 0, 0, limit, 0, 0)
	// The provider's bucket, with another application taking 300 tokens a
	// second, and llmq calls of 500 tokens twice a second.
	prov := float64(limit)
	var drain float64
	for i := range 600 {
		e.clock.Add(500 * time.Millisecond)
		prov = math.Min(limit, prov+500-150) // refill, less the other application
		res := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 500})
		if !res.Allowed {
			continue
		}
		prov -= 500
		st := mustSettle(t, tb, res.Reservation, Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: int64(math.Max(prov, 0)), Limit: limit}}})
		drain = tpmOf(st).Drain
		if i == 599 {
			break
		}
	}
	if drain < 0.25 || drain > 0.35 {
		t.Fatalf("learned drain %.3f, want about 0.30", drain)
	}
	li := mustInspect(t, tb, s)
	if d := li.Buckets[0].Drain; math.Abs(d-drain) > 1e-6 {
		t.Fatalf("Inspect drain %v, Settle's %v", d, drain)
	}
}

// An unpredicted 429 lowers the bucket's limit factor (once per cooldown),
// which comes back slowly.
func testSettleEvidence(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("evidence", 0, 0, 10_000, 0, 0)
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100}).Reservation
	if f := tpmOf(mustSettle(t, tb, r, Feedback{Evidence: []string{"tpm"}})).Factor; math.Abs(f-factorDecrease) > 1e-6 {
		t.Fatalf("factor %v after a 429, want %v", f, factorDecrease)
	}
	r = mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100}).Reservation
	if f := tpmOf(mustSettle(t, tb, r, Feedback{Evidence: []string{"tpm"}})).Factor; math.Abs(f-factorDecrease) > 1e-6 {
		t.Fatalf("factor %v after a second 429 within the cooldown, want %v", f, factorDecrease)
	}
	// The capacity is 8,500 now: 200 used leaves 8,300.
	if got := remaining(mustState(t, tb, s)); got["tpm"] != 8300 {
		t.Fatalf("remaining %v, want 8300 of a factor 0.85", got)
	}
	e.clock.Add(time.Minute) // +0.05
	li := mustInspect(t, tb, s)
	if f := li.Buckets[0].Factor; math.Abs(f-(factorDecrease+factorRecovery)) > 1e-6 {
		t.Fatalf("factor %v a minute later, want %v", f, factorDecrease+factorRecovery)
	}
	e.clock.Add(5 * time.Minute)
	if f := mustInspect(t, tb, s).Buckets[0].Factor; f != 1 {
		t.Fatalf("factor %v after six minutes, want 1", f)
	}
}

// Repeated unpredicted 429s mean the provider's counts cannot be believed:
// they no longer lower the buckets, only raise them.
func testSettleDistrust(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("distrust", 0, 0, 10_000, 0, 0)
	for range distrustAfter {
		r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100}).Reservation
		mustSettle(t, tb, r, Feedback{Evidence: []string{"tpm"}})
		e.clock.Add(factorCooldown)
	}
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100}).Reservation
	b := tpmOf(mustSettle(t, tb, r, Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: 10_000}}}))
	if b.Level != b.Model || b.Level == 0 {
		t.Fatalf("a distrusted answer lowered the bucket: %+v", b)
	}
	if !mustInspect(t, tb, s).Distrusted {
		t.Fatal("Inspect does not say the counts are distrusted")
	}
}

// The calibration is the median of the last prompt ratios: a few outliers
// do not move it; it applies from three calls on, within its bounds.
func testSettleCalibration(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("calib", 0, 0, 1_000_000, 0, 0)
	settle := func(ratio float64) Calibration {
		r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 10}).Reservation
		return mustSettle(t, tb, r, Feedback{PromptRatio: ratio}).Calibration
	}
	if c := settle(1.6); c.Factor != 1 || c.Samples != 1 {
		t.Fatalf("after one call %+v, want factor 1 (too few)", c)
	}
	settle(1.6)
	if c := settle(1.6); c.Factor != 1.6 || c.Samples != 3 {
		t.Fatalf("after three calls %+v, want 1.6", c)
	}
	for _, r := range []float64{50, 0.01, 1.6, 1.6, 9} {
		settle(r)
	}
	c := settle(1.6)
	if c.Factor != 1.6 {
		t.Fatalf("with outliers %+v, want the median 1.6", c)
	}
	got, err := tb.Calibration(context.Background(), s.Name)
	if err != nil || got != c {
		t.Fatalf("Calibration = %+v, %v; want %+v", got, err, c)
	}
	for range calibrationSamples {
		settle(20)
	}
	if c := settle(20); c.Factor != calibrationBounds[1] || c.Samples != calibrationSamples {
		t.Fatalf("%+v, want the upper bound %v over %d samples", c, calibrationBounds[1], calibrationSamples)
	}
}

// The calibration's median is that of the last calibrationSamples ratios
// (clamped, to four decimals) whatever their order, also when the scope's
// hash holds samples in the form written before the sorted copy existed.
func testSettleCalibrationMedian(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("median", 0, 0, 1_000_000, 0, 0)
	key := e.keys.LimiterScope(s.Name)
	// three samples in the older form: unpadded, unsorted, no qs
	if err := e.rdb.HSet(ctx, key, "q", "1.2500,0.5000,3.0000", "qm", "1.25", "qn", "3").Err(); err != nil {
		t.Fatal(err)
	}
	kept := []float64{1.25, 0.5, 3}
	rng := rand.New(rand.NewPCG(1, 2))
	inside := 0 // medians within the bounds, so that the factor tells them apart
	for i := range 100 {
		ratio := max(math.Round(rng.Float64()*3*1e4)/1e4, 0.0001) // the median within the bounds
		if i%13 == 0 {
			ratio = 12 // beyond the clamp
		} else if i%9 == 0 {
			ratio = kept[len(kept)-1] // repeats
		}
		r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 10}).Reservation
		c := mustSettle(t, tb, r, Feedback{PromptRatio: ratio}).Calibration
		kept = append(kept, math.Round(min(max(ratio, 0.1), 10)*1e4)/1e4)
		if len(kept) > calibrationSamples {
			kept = kept[1:]
		}
		sorted := slices.Sorted(slices.Values(kept))
		n := len(sorted)
		want := sorted[n/2]
		if n%2 == 0 {
			want = (sorted[n/2-1] + sorted[n/2]) / 2
		}
		if want > calibrationBounds[0] && want < calibrationBounds[1] {
			inside++
		}
		want = min(max(want, calibrationBounds[0]), calibrationBounds[1])
		if c.Samples != n || math.Abs(c.Factor-want) > 1e-6 {
			t.Fatalf("settle %d (ratio %v): %+v, want the median %v of %d samples", i, ratio, c, want, n)
		}
	}
	if inside < 90 {
		t.Fatalf("only %d medians within the bounds: the test tells little", inside)
	}
	// The first settle rewrote the hash of the older form in one field, its
	// fields dropped; the samples are the last ones, in arrival order.
	if fields := e.rdb.HKeys(ctx, key).Val(); !slices.Equal(fields, []string{"m"}) {
		t.Fatalf("the scope's hash holds %q, want only its state m", fields)
	}
	if got := storedSamples(t, e, key); !slices.Equal(got, kept) {
		t.Fatalf("the state keeps the samples %v, want %v", got, kept)
	}
}

// storedSamples returns the calibration's samples the scope's state at key
// holds (qa), and fails when the older form's q or qs is still there.
func storedSamples(t *testing.T, e *env, key string) []float64 {
	t.Helper()
	v, err := e.rdb.Eval(context.Background(), `
local msgpack = rawget(_G, 'cmsgpack')
local st = (msgpack and msgpack.unpack or cjson.decode)(redis.call('HGET', KEYS[1], 'm'))
if st.q or st.qs then return redis.error_reply('the older form q, qs is still there') end
local out = {}
for i, v in ipairs(st.qa or {}) do out[i] = string.format('%.4f', v) end
return out`, []string{key}).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	samples := make([]float64, len(v))
	for i, s := range v {
		if samples[i], err = strconv.ParseFloat(s, 64); err != nil {
			t.Fatal(err)
		}
	}
	return samples
}

// A state of one field whose calibration holds its samples as the fixed-width
// records of the form before qa (q in arrival order, qs sorted) is read as
// it was, and rewritten as qa by the first run that writes, a reserve here.
func testSettleCalibrationRecords(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("records", 0, 0, 1_000_000, 0, 0)
	key := e.keys.LimiterScope(s.Name)
	q := "01.2500,00.5000,03.0000,02.0000"
	err := e.rdb.Eval(ctx, `
local msgpack = rawget(_G, 'cmsgpack')
local st = {q = ARGV[1], qs = ARGV[2], qm = 1.625, qn = 4}
redis.call('HSET', KEYS[1], 'm', (msgpack and msgpack.pack or cjson.encode)(st))
redis.call('PEXPIRE', KEYS[1], 3600000)
return 1`, []string{key}, q, "00.5000,01.2500,02.0000,03.0000").Err()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := tb.Calibration(ctx, s.Name); err != nil || c.Factor != 1.625 || c.Samples != 4 {
		t.Fatalf("the older records' calibration: %+v, %v; want 1.625 of 4", c, err)
	}
	mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 10})
	if got, want := storedSamples(t, e, key), []float64{1.25, 0.5, 3, 2}; !slices.Equal(got, want) {
		t.Fatalf("after a reserve the state keeps the samples %v, want %v", got, want)
	}
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 10}).Reservation
	if c := mustSettle(t, tb, r, Feedback{PromptRatio: 2.5}).Calibration; c.Factor != 2 || c.Samples != 5 {
		t.Fatalf("after a fifth sample %+v, want the median 2 of 5", c)
	}
	if got, want := storedSamples(t, e, key), []float64{1.25, 0.5, 3, 2, 2.5}; !slices.Equal(got, want) {
		t.Fatalf("after a settle the state keeps the samples %v, want %v", got, want)
	}
}

// A scope that learned something keeps its hash for learnTTL after its last
// use, so an idle scope remembers.
func testSettleLearnedTTL(t *testing.T, e *env) {
	ctx := context.Background()
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("ttl", 0, 0, 1000, 0, 0)
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 10}).Reservation
	mustSettle(t, tb, r, Feedback{PromptRatio: 1.2})
	ttl, err := e.rdb.PTTL(ctx, e.keys.LimiterScope(s.Name)).Result()
	if err != nil || ttl < learnTTL {
		t.Fatalf("TTL %v (%v), want at least %v", ttl, err, learnTTL)
	}
}

func mustInspect(t *testing.T, tb *TokenBucket, s Scope) *ScopeLearning {
	t.Helper()
	li, err := tb.Inspect(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	return li
}

// A bucket whose limit is below the provider's (a policy that keeps room for
// others) keeps its own count: the provider's larger room never takes it
// past its limit; a provider that has used more still raises it.
func testSettleBelowTheProvidersLimit(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("below", 0, 0, 10_000, 0, 0)
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 6000}).Reservation
	b := tpmOf(mustSettle(t, tb, r, Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: 50_000, Limit: 60_000}}}))
	if b.Level != 6000 {
		t.Fatalf("with the provider at 60,000 and 50,000 left: %+v, want the bucket's own 6000", b)
	}
	e.clock.Add(time.Second)
	r = mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100}).Reservation
	b = tpmOf(mustSettle(t, tb, r, Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: 1000, Limit: 60_000}}}))
	if b.Level <= b.Model {
		t.Fatalf("the provider used more than the bucket counts: %+v, want it raised", b)
	}
}

// Buckets of input and output tokens settle to the call's real usage of
// their kind, up or down (an output limit reserved at max_tokens gets its
// unused part back); requests and total tokens keep today's rule: what the
// provider charged beyond the reservation is taken, nothing is given back.
// Over many generated calls on a stopped clock, each bucket's level is
// exactly the sum its rule gives.
func testSettleDimensions(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := ModelScope("dims", map[string]int64{"rpm": 1_000, "tpm": 10_000_000, "itpm": 1_000_000, "otpm": 100_000, "otpd": 1_000_000}, 0)
	if got := bucketNames(s); !slices.Equal(got, []string{"rpm", "tpm", "itpm", "otpm", "otpd"}) {
		t.Fatalf("buckets %v", got)
	}
	rng := rand.New(rand.NewPCG(48, 1))
	var requests, total, input, output int64
	for i := range 200 {
		prompt, maxTokens := 1+rng.Int64N(2_000), 1+rng.Int64N(500)
		r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: prompt + maxTokens, Input: prompt, Output: maxTokens})
		if !r.Allowed {
			t.Fatalf("call %d denied: %+v", i, r)
		}
		requests++
		fb := Feedback{}
		switch rng.IntN(4) {
		case 0: // no usage: the reservation stands in every bucket
			total, input, output = total+prompt+maxTokens, input+prompt, output+maxTokens
		default: // the provider counted the prompt within ±50%, and some output (none too)
			used, completion := max(prompt/2+rng.Int64N(prompt+1), 1), rng.Int64N(maxTokens+1)
			fb = Feedback{Charged: Cost{Requests: 1, Tokens: used + maxTokens, Input: used, Output: completion}, Usage: true}
			total += max(used+maxTokens, prompt+maxTokens)
			input, output = input+used, output+completion
		}
		mustSettle(t, tb, r.Reservation, fb)
	}
	got := remaining(mustState(t, tb, s))
	want := map[string]int64{"rpm": 1_000 - requests, "tpm": 10_000_000 - total, "itpm": 1_000_000 - input,
		"otpm": 100_000 - output, "otpd": 1_000_000 - output}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s remaining %d, want %d", name, got[name], w)
		}
	}

	// A cost one dimension can never hold is refused at once.
	if _, err := tb.Reserve(context.Background(), s, Cost{Requests: 1, Tokens: 200_001, Input: 1, Output: 200_000}); !errors.Is(err, ErrCostExceedsCapacity) {
		t.Fatalf("an output above otpm: %v", err)
	}
}

func bucketNames(s Scope) []string {
	var out []string
	for _, b := range s.Buckets {
		out = append(out, b.Name)
	}
	return out
}
