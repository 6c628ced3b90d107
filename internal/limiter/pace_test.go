package limiter

import (
	"context"
	"math"
	"testing"
	"time"
)

// A bucket with a burst lets out at most its burst at once, however full,
// then its refill at its rate: a minute's worth never goes together. A call
// costing more than the burst goes alone into a whole burst.
func testPaceBoundsBursts(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	// 60,000 a minute: 1,000 a second, a burst of 500.
	s := modelScope("pace", 0, 0, 60_000, 0, 500*time.Millisecond)
	taken := int64(0)
	for {
		r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100})
		if !r.Allowed {
			// 100 of refill at 1,000 a second: 100 ms, whatever the bucket holds
			if r.RetryAfter != 100*time.Millisecond || bucket(t, r, "tpm").Remaining != 59_500 {
				t.Fatalf("denied with %v, bucket %+v; want a 100ms wait with 59,500 held", r.RetryAfter, bucket(t, r, "tpm"))
			}
			break
		}
		taken += 100
	}
	if taken != 500 {
		t.Fatalf("a full bucket let out %d at once, want its burst of 500", taken)
	}
	if st := mustState(t, tb, s); bucket(t, st, "tpm").Burst != 0 {
		t.Fatalf("State's Burst %d, want 0 left to let out", bucket(t, st, "tpm").Burst)
	}
	// Over the next ten seconds it lets out its refill, not its content.
	for range 100 {
		e.clock.Add(100 * time.Millisecond)
		if r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100}); r.Allowed {
			taken += 100
		}
	}
	if taken != 10_500 {
		t.Fatalf("10 s let out %d, want 500 + 10,000", taken)
	}
	// A call above the burst waits for a whole burst, then goes alone.
	if r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 2_000}); r.Allowed || r.RetryAfter != 500*time.Millisecond {
		t.Fatalf("a 2,000-token call: %+v, want a wait of 500ms for the whole burst", r)
	}
	e.clock.Add(500 * time.Millisecond)
	if r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 2_000}); !r.Allowed {
		t.Fatalf("a 2,000-token call into a whole burst was denied: %+v", r)
	}
	// It left the pace 1,500 in debt: 1.5 s before a call of 100... plus 100 ms.
	if r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 100}); r.Allowed || r.RetryAfter != 1600*time.Millisecond {
		t.Fatalf("after the large call: %+v, want a wait of 1.6s", r)
	}
}

// A released call gives its pace back; a 429 the buckets did not predict
// empties it, since the provider's window is empty then.
func testPaceReleaseAndRefusal(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("pace-release", 0, 0, 60_000, 0, 500*time.Millisecond)
	released := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 500}).Reservation
	if err := tb.Release(context.Background(), released); err != nil {
		t.Fatal(err)
	}
	r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 500})
	if !r.Allowed {
		t.Fatalf("the released call's pace did not come back: %+v", r)
	}
	e.clock.Add(time.Second) // the pace is whole again
	mustSettle(t, tb, r.Reservation, Feedback{Refused: true, ShortWindow: []string{"tpm"}})
	if st := mustState(t, tb, s); bucket(t, st, "tpm").Burst != 0 {
		t.Fatalf("pace after a short window's 429: %d, want 0", bucket(t, st, "tpm").Burst)
	}
}

// 429s that showed a shorter window lower the burst (once per cooldown),
// then the pace below the rate; the burst comes back slowly. Inspect says
// so.
func testPaceLearnsShortWindows(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("pace-learn", 0, 0, 60_000, 0, time.Second)
	short := func() *Settlement {
		r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 10})
		if !r.Allowed {
			t.Fatalf("reserve: %+v", r)
		}
		return mustSettle(t, tb, r.Reservation, Feedback{Refused: true, ShortWindow: []string{"tpm"}})
	}
	if bf := tpmOf(short()).BurstFactor; math.Abs(bf-burstDecrease) > 1e-6 {
		t.Fatalf("burst factor %v after a 429 with room shown, want %v", bf, burstDecrease)
	}
	e.clock.Add(time.Second)
	// a second later: regained a sixtieth of burstRecovery, no lower
	if bf := tpmOf(short()).BurstFactor; math.Abs(bf-burstDecrease-burstRecovery/60) > 1e-6 {
		t.Fatalf("burst factor %v after a second 429 within the cooldown, want it unchanged", bf)
	}
	li := mustInspect(t, tb, s)
	b := li.Buckets[0]
	if b.Burst != 251 || b.BurstWindow.Round(time.Millisecond) != 252*time.Millisecond || b.Factor != 1 || b.PaceFactor != 1 {
		t.Fatalf("learning %+v, want a burst of about 250 ms (250 tokens), the limit and the pace whole", b)
	}
	// With the burst below half its window, the next one slows the pace.
	e.clock.Add(factorCooldown)
	short()
	b = mustInspect(t, tb, s).Buckets[0]
	if math.Abs(b.PaceFactor-shortDecrease) > 1e-6 || b.Factor != 1 {
		t.Fatalf("learning %+v, want the pace at %v and the limit whole", b, shortDecrease)
	}
	e.clock.Add(10 * time.Minute)
	if bf := mustInspect(t, tb, s).Buckets[0].BurstFactor; bf != 1 {
		t.Fatalf("burst factor %v after ten minutes, want it whole again", bf)
	}
}

// Two unpredicted 429s within a minute bound the provider's rate by what
// went through between them: the limit factor drops there at once, not
// 15% a time.
func testPaceRateEstimate(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	// The policy says 60,000; the provider's bucket refills 30,000 a minute.
	s := modelScope("estimate", 0, 0, 60_000, 0, 0)
	call := func(refused bool, tokens int64) {
		r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: tokens})
		if !r.Allowed {
			t.Fatalf("reserve: %+v", r)
		}
		fb := Feedback{}
		if refused {
			fb = Feedback{Refused: true, Evidence: []string{"tpm"}}
		}
		mustSettle(t, tb, r.Reservation, fb)
	}
	call(true, 100)
	if f := mustInspect(t, tb, s).Buckets[0].Factor; math.Abs(f-factorDecrease) > 1e-6 {
		t.Fatalf("factor %v after the first 429, want %v", f, factorDecrease)
	}
	// 10 s at the provider's 500 a second go through, then a 429.
	for range 10 {
		e.clock.Add(time.Second)
		call(false, 500)
	}
	call(true, 100)
	want := 0.5 * estimateSafety
	if f := mustInspect(t, tb, s).Buckets[0].Factor; math.Abs(f-want) > 0.01 {
		t.Fatalf("factor %v after the second 429, want about %v (30,000 of 60,000, less a margin)", f, want)
	}
}

// While the provider's counts show half its bucket free, the pace's rate
// grows (it may refund unused tokens), up to twice the rate; a 429 the
// buckets did not predict brings it back and holds it.
func testPaceGrowsWhileTheProviderShowsRoom(t *testing.T, e *env) {
	tb := must(NewTokenBucket(e.rdb, e.opts()))
	s := modelScope("pace-grow", 0, 0, 60_000, 0, 500*time.Millisecond)
	answer := func(fb Feedback) {
		r := mustReserve(t, tb, s, Cost{Requests: 1, Tokens: 10})
		if !r.Allowed {
			t.Fatalf("reserve: %+v", r)
		}
		mustSettle(t, tb, r.Reservation, fb)
	}
	room := Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: 59_000, Limit: 60_000}}}
	for range 30 {
		e.clock.Add(time.Second)
		answer(room)
	}
	// the first answer starts the count: 29 s of growth
	if p := mustInspect(t, tb, s).Buckets[0].PaceFactor; math.Abs(p-(1+29*paceGrowth)) > 1e-6 {
		t.Fatalf("pace %v after 30 answers a second apart showing room, want %v", p, 1+29*paceGrowth)
	}
	busy := Feedback{Observed: []Observed{{Bucket: "tpm", Remaining: 10_000, Limit: 60_000}}}
	e.clock.Add(time.Second)
	answer(busy)
	if p := mustInspect(t, tb, s).Buckets[0].PaceFactor; math.Abs(p-(1+29*paceGrowth)) > 1e-6 {
		t.Fatalf("pace %v grew while the provider's bucket was busy", p)
	}
	answer(Feedback{Refused: true, ShortWindow: []string{"tpm"}})
	e.clock.Add(time.Second)
	answer(room)
	if p := mustInspect(t, tb, s).Buckets[0].PaceFactor; p != 1 {
		t.Fatalf("pace %v after a 429, want 1 and held there", p)
	}
	e.clock.Add(paceHold)
	answer(room)
	e.clock.Add(time.Second)
	answer(room)
	if p := mustInspect(t, tb, s).Buckets[0].PaceFactor; math.Abs(p-(1+2*paceGrowth)) > 1e-6 { // a second counted at each answer
		t.Fatalf("pace %v after the hold, want it growing again", p)
	}
}
