package worker

import (
	"testing"
	"time"
)

type recordObserver struct {
	nopObserver
	states []string
}

func (r *recordObserver) BreakerState(provider, state string) {
	r.states = append(r.states, provider+":"+state)
}

func TestBreakerOpensAfterStraightFaultsAndProbes(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	obs := &recordObserver{}
	bs := NewBreakers(BreakerOptions{Failures: 3, Cooldown: 10 * time.Second, MaxCooldown: 25 * time.Second}, obs, func() time.Time { return now })

	// Faults interrupted by a success never open the circuit.
	for _, fault := range []bool{true, true, false, true, true} {
		if ok, _ := bs.Allow("p"); !ok {
			t.Fatal("closed circuit refused a call")
		}
		bs.Record("p", fault)
	}
	if bs.State("p") != BreakerClosed {
		t.Fatalf("state = %s after faults interrupted by a success", bs.State("p"))
	}
	bs.Allow("p")
	bs.Record("p", true) // third in a row
	if ok, wait := bs.Allow("p"); ok || wait != 10*time.Second || bs.State("p") != BreakerOpen {
		t.Fatalf("after 3 straight faults: allow %v wait %v state %s", ok, wait, bs.State("p"))
	}
	// Another provider is not affected.
	if ok, _ := bs.Allow("q"); !ok {
		t.Fatal("one provider's breaker stopped another")
	}

	// After the cooldown exactly one probe goes.
	now = now.Add(10 * time.Second)
	if ok, _ := bs.Allow("p"); !ok || bs.State("p") != BreakerHalfOpen {
		t.Fatalf("probe refused: %s", bs.State("p"))
	}
	if ok, _ := bs.Allow("p"); ok {
		t.Fatal("a second call went while the probe was out")
	}
	// The probe fails: open again for twice as long (capped).
	bs.Record("p", true)
	if ok, wait := bs.Allow("p"); ok || wait != 20*time.Second {
		t.Fatalf("after a failed probe: allow %v wait %v", ok, wait)
	}
	now = now.Add(20 * time.Second)
	bs.Allow("p")
	bs.Record("p", true)
	if _, wait := bs.Allow("p"); wait != 25*time.Second {
		t.Fatalf("cooldown not capped: %v", wait)
	}
	// A probe answered 429 says nothing: released, the next call probes.
	now = now.Add(25 * time.Second)
	bs.Allow("p")
	bs.Done("p")
	if ok, _ := bs.Allow("p"); !ok {
		t.Fatal("the probe slot was not released by Done")
	}
	// A successful probe closes the circuit and resets the cooldown.
	bs.Record("p", false)
	if bs.State("p") != BreakerClosed {
		t.Fatalf("state after a good probe = %s", bs.State("p"))
	}
	want := []string{"p:open", "p:half-open", "p:open", "p:half-open", "p:open", "p:half-open", "p:closed"}
	if len(obs.states) != len(want) {
		t.Fatalf("observed %v, want %v", obs.states, want)
	}
	for i := range want {
		if obs.states[i] != want[i] {
			t.Fatalf("observed %v, want %v", obs.states, want)
		}
	}
}
