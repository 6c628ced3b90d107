package limiter

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// admission is one admitted cost at its Redis time.
type admission struct {
	at   int64 // µs
	cost Cost
}

// testAdmissionProperty runs 64 to 128 goroutines over 4 to 6 clients,
// Waiting with random costs on random limits for 10 s of real time, and
// checks, on the Redis times of the admissions:
//   - no window [a, b] of any bucket admits more than capacity + refill×(b-a)
//     (zero overshoot);
//   - demand above the limit gets at least 98% of what the binding bucket
//     allows over the run.
//
// It runs twice at once, on two scopes: with plain permits, and in the mode
// llmq's workers use, HoldInFlight, where every admission is reconciled with
// its cost as soon as it is made (the floor of what is in flight must never
// let a window admit more, and its waits must cost no admissions).
func testAdmissionProperty(t *testing.T, e *env) {
	var wg sync.WaitGroup
	for _, hold := range []bool{false, true} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			admissionProperty(t, e, hold)
		}()
	}
	wg.Wait()
}

// admissionProperty is one run of testAdmissionProperty; it may run on
// another goroutine than the test's.
func admissionProperty(t *testing.T, e *env, hold bool) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	maxCost := int64(10 + rng.IntN(90))
	avg := float64(1+maxCost) / 2
	perSec := 40 + rng.IntN(40) // admissions per second the binding bucket allows
	pr := time.Duration(1+rng.IntN(4)) * time.Second
	pt := time.Duration(1+rng.IntN(4)) * time.Second
	longest := float64(max(pr, pt) / time.Second)
	// The other bucket has three times the room.
	reqs := int64(float64(perSec) * float64(pr/time.Second))
	toks := int64(float64(perSec) * avg * float64(pt/time.Second))
	binding := "requests"
	if rng.IntN(2) == 0 {
		binding = "tokens"
		reqs = int64(3 * float64(perSec) * longest)
	} else {
		toks = int64(3 * float64(perSec) * avg * longest)
	}
	name := "property"
	if hold {
		name = "property-held"
	}
	s := Scope{Name: name, Buckets: []Bucket{
		{Name: "requests", Unit: UnitRequests, Limit: reqs, Period: pr},
		{Name: "tokens", Unit: UnitTokens, Limit: toks, Period: pt},
	}}
	workers, clients := 64+rng.IntN(65), 4+rng.IntN(3)
	t.Logf("%s: seed %d: %d workers on %d clients, %s binding, buckets %+v, costs 1..%d tokens, held in flight %v",
		s.Name, seed, workers, clients, binding, s.Buckets, maxCost, hold)

	o := e.realOpts()
	o.HoldInFlight = hold
	tbs := make([]*TokenBucket, clients)
	for i := range tbs {
		tbs[i] = must(NewTokenBucket(e.newClient(), o))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t0 := e.rdb.Time(ctx).Val()
	var (
		mu   sync.Mutex
		all  []admission
		wg   sync.WaitGroup
		errs = make(chan error, workers)
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			tb := tbs[w%clients]
			var mine []admission
			for ctx.Err() == nil {
				c := Cost{Requests: 1, Tokens: 1 + r.Int64N(maxCost)}
				res, err := tb.Wait(ctx, s, c)
				if err != nil {
					// The run's end: done, or the next admission is after it.
					if !errors.Is(err, context.DeadlineExceeded) {
						errs <- err
					}
					break
				}
				mine = append(mine, admission{res.Time.UnixMicro(), c})
				if hold {
					if err := tb.Reconcile(context.WithoutCancel(ctx), res.Reservation, c); err != nil {
						errs <- err
						break
					}
				}
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	t1 := e.rdb.Time(context.Background()).Val()
	close(errs)
	for err := range errs {
		t.Errorf("%s: %v", s.Name, err)
		return
	}
	slices.SortFunc(all, func(a, b admission) int { return cmp.Compare(a.at, b.at) })

	// The run starts at the first admission: dialing the clients' connections
	// (a cluster's three nodes each) and starting the workers on a loaded
	// machine is not time the limiter could admit in.
	start := t0
	if len(all) > 0 {
		start = time.UnixMicro(all[0].at)
	}
	run := t1.Sub(start)
	// Held in flight, a refill is counted only once the calls before it
	// have reconciled: each reconcile's round trip, longer on a starved
	// CPU, is room left unused.
	minShare := 0.98
	if hold {
		minShare = 0.97
	}
	for _, b := range s.Buckets {
		over, total := maxOvershoot(all, b)
		allows := float64(b.Limit) + float64(b.Limit)*run.Seconds()/b.Period.Seconds()
		t.Logf("%s bucket %s: admitted %d of %.0f allowed over %v (%.2f%%); worst window over capacity+refill by %.9f",
			s.Name, b.Name, total, allows, run, 100*float64(total)/allows, over)
		if over > 1e-6*float64(b.Limit) {
			t.Errorf("%s bucket %s: a window admitted %.6f more than capacity + refill", s.Name, b.Name, over)
		}
		if b.Name == binding && float64(total) < minShare*allows {
			t.Errorf("%s bucket %s: admitted %d < %.0f%% of the %.0f the limit allows", s.Name, b.Name, total, 100*minShare, allows)
		}
	}
}

// maxOvershoot returns, for admissions sorted by time, the largest amount by
// which the admissions of one window [a, b] exceed the bucket's capacity +
// refill×(b-a), over every window (negative when none does), and the total
// admitted. Admissions at one time are grouped, so every window is covered.
func maxOvershoot(adms []admission, b Bucket) (float64, int64) {
	rate := float64(b.Limit) / float64(b.Period.Microseconds()) // per µs
	var (
		total int64
		// best is max over window starts i <= j of rate×t_i - S_{i-1}.
		best = -1e300
		over = -1e300
	)
	for i := 0; i < len(adms); {
		at := adms[i].at
		start := rate*float64(at) - float64(total)
		for ; i < len(adms) && adms[i].at == at; i++ {
			total += adms[i].cost.Of(b.Unit)
		}
		best = max(best, start)
		// sum of the window [t_start, at] - rate×(at - t_start) - capacity
		over = max(over, float64(total)-rate*float64(at)+best-float64(b.Limit))
	}
	return over, total
}

// maxOvershoot finds the worst window, and only it.
func TestMaxOvershoot(t *testing.T) {
	t.Parallel()
	b := Bucket{Name: "b", Unit: UnitTokens, Limit: 10, Period: 10 * time.Microsecond} // 1 per µs
	adms := []admission{{0, Cost{Tokens: 10}}, {5, Cost{Tokens: 5}}, {5, Cost{Tokens: 1}}, {100, Cost{Tokens: 3}}}
	// [0, 5]: 16 admitted, 10 + 5 allowed: 1 over.
	if over, total := maxOvershoot(adms, b); over != 1 || total != 19 {
		t.Fatalf("maxOvershoot = %v, %d; want 1, 19", over, total)
	}
}
