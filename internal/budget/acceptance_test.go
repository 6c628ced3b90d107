package budget_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/rkeys"
	"github.com/llmq/llmq/internal/testutil"
)

// The acceptance of the budget: 200 concurrent jobs of one tenant with a
// $1.00 budget and $3.00 of worst-case estimates, through several workers:
// at most $1.00 is charged, a job refused only by what others hold tries
// again until it runs or the spend itself refuses it, the rest is deferred
// to midnight of the injected clock, and after the reset the deferred jobs
// run and finish.

type job struct {
	ID       string
	Estimate money.Micros
	Cost     money.Micros // the real cost, at most the estimate
}

type outcome struct {
	ID         string
	Allowed    bool
	Charged    money.Micros
	DeniedBy   string
	TooLarge   bool
	RetryAfter time.Duration
	ResetsAt   time.Time
	Day        string
	GlobalDay  string
	Err        string
}

// plan returns n jobs whose estimates add up to exactly total, with real
// costs between half the estimate and all of it.
func plan(n int, total money.Micros, seed uint64) []job {
	rng := rand.New(rand.NewPCG(seed, seed))
	weights := make([]int64, n)
	var sum int64
	for i := range weights {
		weights[i] = 1 + rng.Int64N(100)
		sum += weights[i]
	}
	jobs := make([]job, n)
	var given money.Micros
	for i := range jobs {
		est := money.Micros(int64(total) * weights[i] / sum)
		if i == n-1 {
			est = total - given
		}
		given += est
		jobs[i] = job{ID: fmt.Sprintf("job_%03d", i), Estimate: est, Cost: est/2 + money.Micros(rng.Int64N(int64(est/2)+1))}
	}
	return jobs
}

// runJobs runs every job at once, job i through workers[i%len(workers)], as
// the worker's handler does: reserve the estimate; when allowed write the
// ledger row and settle at the real cost; when denied for spend, defer.
// The jobs refused only by what others held run again, all at once, as
// the handler's do a second later, until none is.
func runJobs(ctx context.Context, workers []*budget.Budgets, led *ledger, acct budget.Account, jobs []job) []outcome {
	out := make([]outcome, len(jobs))
	held := make([]bool, len(jobs))
	for i := range held {
		held[i] = true
	}
	for round := 0; slices.Contains(held, true); round++ {
		if round == 100 {
			panic("jobs still refused by holds after 100 rounds")
		}
		runRound(ctx, workers, led, acct, jobs, held, out)
	}
	return out
}

// runRound runs at once the jobs held says, and says which were refused
// only by what others held.
func runRound(ctx context.Context, workers []*budget.Budgets, led *ledger, acct budget.Account, jobs []job, held []bool, out []outcome) {
	var wg sync.WaitGroup
	for i, j := range jobs {
		if !held[i] {
			continue
		}
		wg.Go(func() {
			o := outcome{ID: j.ID}
			w := workers[i%len(workers)]
			res, d, err := w.Reserve(ctx, acct, j.ID, j.Estimate)
			held[i] = err == nil && !d.Allowed && d.Held
			if err == nil && d.Allowed {
				led.record(res, j.Cost)
				err = w.Settle(ctx, res, j.Cost, true)
				o.Allowed, o.Charged, o.Day, o.GlobalDay = true, j.Cost, res.Day, res.GlobalDay
			} else if err == nil {
				o.DeniedBy, o.TooLarge, o.RetryAfter, o.ResetsAt, o.Day = d.DeniedBy, d.TooLarge, d.RetryAfter, d.ResetsAt, d.Day
			}
			if err != nil {
				o.Err = err.Error()
			}
			out[i] = o
		})
	}
	wg.Wait()
}

// checkDay asserts one day of the acceptance run and returns the deferred jobs.
func checkDay(t *testing.T, e *env, acct budget.Account, jobs []job, out []outcome, midnight time.Time) (pending []job, charged money.Micros) {
	t.Helper()
	now := e.clock.Now()
	admitted := 0
	for i, o := range out {
		switch {
		case o.Err != "":
			t.Fatalf("job %s: %s", o.ID, o.Err)
		case o.Allowed:
			admitted++
			charged += o.Charged
		default:
			if o.DeniedBy != "tenant" || o.TooLarge || o.RetryAfter != midnight.Sub(now) || !o.ResetsAt.Equal(midnight) {
				t.Fatalf("job %s denied by %q TooLarge=%v retry after %v resets at %v, want tenant, %v, %v",
					o.ID, o.DeniedBy, o.TooLarge, o.RetryAfter, o.ResetsAt, midnight.Sub(now), midnight)
			}
			pending = append(pending, jobs[i])
		}
	}
	if charged > acct.Budget {
		t.Fatalf("charged %s on %s, more than the budget %s", charged, now.Format(time.DateOnly), acct.Budget)
	}
	// Deferred only for spend: with what the day charged, it cannot fit.
	for _, j := range pending {
		if charged+j.Estimate <= acct.Budget {
			t.Fatalf("job %s (%s) deferred to the reset, though the day charged %s of %s", j.ID, j.Estimate, charged, acct.Budget)
		}
	}
	if admitted == 0 {
		t.Fatalf("no job ran on %s", now.Format(time.DateOnly))
	}
	d := e.wantSpend(acct, charged, 0)
	if got := e.ledger.tenant(acct.TenantID, d.Day); got != charged {
		t.Fatalf("ledger has %s for %s, Redis %s", got, d.Day, charged)
	}
	t.Logf("%s: %d jobs ran, charged %s, %d deferred %v", d.Day, admitted, charged, len(pending), midnight.Sub(now))
	return pending, charged
}

// finishLater moves the clock past each midnight until every deferred job has run.
func finishLater(t *testing.T, e *env, workers []*budget.Budgets, acct budget.Account, pending []job, midnight time.Time) {
	t.Helper()
	for day := 1; len(pending) > 0; day++ {
		if day > 5 {
			t.Fatalf("%d jobs still deferred after %d resets", len(pending), day-1)
		}
		e.clock.Set(midnight.Add(time.Second))
		midnight = midnight.Add(24 * time.Hour)
		out := runJobs(e.ctx, workers, e.ledger, acct, pending)
		pending, _ = checkDay(t, e, acct, pending, out, midnight)
	}
}

func TestAcceptanceConcurrentClients(t *testing.T) {
	t.Parallel()
	midnight := utc("2025-06-11T00:00:00Z")
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T20:15:00Z"))
	var workers []*budget.Budgets
	for range 4 {
		workers = append(workers, e.budgets(testutil.Redis(t, testDB)))
	}
	acct := budget.Account{TenantID: "ten_acc", Budget: dollar, SoftLimit: 0.8}
	jobs := plan(200, 3*dollar, 1)

	out := runJobs(e.ctx, workers, e.ledger, acct, jobs)
	pending, _ := checkDay(t, e, acct, jobs, out, midnight)
	if len(pending) == 0 {
		t.Fatal("$3.00 of estimates against $1.00 deferred nothing")
	}
	finishLater(t, e, workers, acct, pending, midnight)
}

// childEnv tells the test binary it runs as one worker process of
// TestAcceptanceProcesses; childSpec carries what it runs.
const (
	childEnv  = "LLMQ_BUDGET_TEST_CHILD"
	childSpec = "LLMQ_BUDGET_TEST_SPEC"
)

type spec struct {
	RedisURL string
	Prefix   string
	Now      time.Time
	Account  budget.Account
	Jobs     []job
}

// runChild is a worker process: it runs its jobs through its own client and
// prints the outcomes as JSON.
func runChild() int {
	var s spec
	if err := json.Unmarshal([]byte(os.Getenv(childSpec)), &s); err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		return 2
	}
	opt, err := redis.ParseURL(s.RedisURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child redis url:", err)
		return 2
	}
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	clk := testutil.NewClock(s.Now)
	b := testutil.Must(budget.New(rdb, newLedger(), budget.Options{Keys: rkeys.New(s.Prefix), Clock: clk.Now}))
	out := runJobs(context.Background(), []*budget.Budgets{b}, newLedger(), s.Account, s.Jobs)
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "child output:", err)
		return 2
	}
	return 0
}

func TestAcceptanceProcesses(t *testing.T) {
	t.Parallel()
	const procs = 4
	midnight := utc("2025-06-11T00:00:00Z")
	e := setup(t, testutil.Redis(t, testDB), utc("2025-06-10T20:15:00Z"))
	acct := budget.Account{TenantID: "ten_procs", Budget: dollar, SoftLimit: 0.8}
	jobs := plan(200, 3*dollar, 2)
	// Start the day here, so that a child never needs this process's ledger.
	e.wantSpend(acct, 0, 0)

	parts := make([][]job, procs)
	for i, j := range jobs {
		parts[i%procs] = append(parts[i%procs], j)
	}
	outs := make([][]outcome, procs)
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for p := range procs {
		wg.Go(func() {
			s, _ := json.Marshal(spec{
				RedisURL: testutil.RedisURLForDB(t, testDB), Prefix: e.keys.Prefix(),
				Now: e.clock.Now(), Account: acct, Jobs: parts[p],
			})
			cmd := exec.CommandContext(e.ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), childEnv+"=1", childSpec+"="+string(s))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				errs <- fmt.Errorf("worker process %d: %v\n%s", p, err, stderr.String())
				return
			}
			if err := json.Unmarshal(stdout.Bytes(), &outs[p]); err != nil {
				errs <- fmt.Errorf("worker process %d output: %v\n%s", p, err, stdout.String())
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// The children kept their own ledgers; copy their rows into this one.
	var all []outcome
	var ordered []job
	for p := range procs {
		all = append(all, outs[p]...)
		ordered = append(ordered, parts[p]...)
		for _, o := range outs[p] {
			if o.Allowed {
				e.ledger.add(acct.TenantID, o.Day, o.GlobalDay, o.Charged)
			}
		}
	}
	pending, _ := checkDay(t, e, acct, ordered, all, midnight)
	if len(pending) == 0 {
		t.Fatal("$3.00 of estimates against $1.00 deferred nothing")
	}
	finishLater(t, e, []*budget.Budgets{e.b}, acct, pending, midnight)
}

// A global cap across many tenants, held by many goroutines and clients,
// on one node and on a cluster (where each tenant's day and the global day
// may be on different masters, held by one script each): neither a
// tenant's budget nor the global cap is ever passed, every refusal holds
// nothing, and no reservation is left behind.
func TestGlobalCapAcrossTenantsConcurrently(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		rdb  func() redis.UniversalClient
	}{
		{"node", func() redis.UniversalClient { return testutil.Redis(t, testDB) }},
		{"cluster", func() redis.UniversalClient { return testutil.StartRedisCluster(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rdb := c.rdb()
			e := setup(t, rdb, utc("2025-06-10T12:00:00Z"))
			workers := []*budget.Budgets{e.b, e.budgets(rdb), e.budgets(rdb)}
			const tenants = 12
			var wg sync.WaitGroup
			outs := make([][]outcome, tenants)
			accts := make([]budget.Account, tenants)
			for i := range tenants {
				// $12 of estimates against tenants' $0.50 each ($6) and a $3 global cap.
				accts[i] = budget.Account{TenantID: fmt.Sprintf("ten_%02d", i), Budget: dollar / 2, Global: 3 * dollar}
				wg.Go(func() { outs[i] = runJobs(e.ctx, workers, e.ledger, accts[i], plan(40, dollar, uint64(i+1))) })
			}
			wg.Wait()
			var total money.Micros
			refused := map[string]int{}
			for i, out := range outs {
				var charged money.Micros
				for _, o := range out {
					if o.Err != "" {
						t.Fatalf("job %s of %s: %s", o.ID, accts[i].TenantID, o.Err)
					}
					charged += o.Charged
					if !o.Allowed {
						refused[o.DeniedBy]++
					}
				}
				if charged > accts[i].Budget {
					t.Fatalf("tenant %s charged %s, past its budget %s", accts[i].TenantID, charged, accts[i].Budget)
				}
				// Nothing left held: every refusal let go of the other day.
				e.wantSpend(accts[i], charged, 0)
				total += charged
			}
			d := e.status(accts[0])
			if total > 3*dollar || d.GlobalSpent != total || d.GlobalReserved != 0 {
				t.Fatalf("charged %s in all; global spent %s reserved %s; cap $3", total, d.GlobalSpent, d.GlobalReserved)
			}
			if refused["global"] == 0 {
				t.Fatalf("the global cap refused nothing: %v", refused)
			}
			t.Logf("charged %s of the $3 cap; refusals %v", total, refused)
		})
	}
}
