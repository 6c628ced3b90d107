package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
)

// failoverJobs is how many jobs run through each failover.
const failoverJobs = 2000

// TestRedisFailoverMidRun: 2,000 jobs run on two worker processes (and a
// dispatcher, whose reconciler checks the store against Redis) while
// Redis's master fails over — a Sentinel master SIGKILLed, a planned
// SENTINEL FAILOVER, a cluster master SIGKILLed — and its replica is
// promoted. Every job succeeds, each charged once; the only calls made twice
// are the ones a lost write forces (counted); the tenant ends within its
// budget, its spend in Redis no less than the ledger's; the workers call
// the provider again within 10s of the promotion.
func TestRedisFailoverMidRun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		start func(t *testing.T) (url string, fail func(a *apptest.App) (promoted time.Time))
	}{
		{"sentinel-sigkill", func(t *testing.T) (string, func(*apptest.App) time.Time) {
			g := testutil.StartSentinelGroup(t)
			return g.URL(), func(*apptest.App) time.Time {
				old := g.KillMaster()
				g.WaitPromoted(t, old, 30*time.Second)
				return time.Now()
			}
		}},
		{"sentinel-planned", func(t *testing.T) (string, func(*apptest.App) time.Time) {
			g := testutil.StartSentinelGroup(t)
			return g.URL(), func(*apptest.App) time.Time {
				old := g.Failover()
				g.WaitPromoted(t, old, 30*time.Second)
				return time.Now()
			}
		}},
		{"cluster-sigkill", func(t *testing.T) (string, func(*apptest.App) time.Time) {
			url, nodes := testutil.StartRedisClusterWithReplicas(t)
			return url, func(a *apptest.App) time.Time {
				// The master of the jobs queue's slot.
				key := "asynq:{" + a.Queue.Namespace().Queue(queue.Jobs) + "}:pending"
				m, err := a.Redis.(*redis.ClusterClient).MasterForKey(context.Background(), key)
				if err != nil {
					t.Fatal(err)
				}
				testutil.KillClusterMaster(t, nodes, m.Options().Addr)
				return time.Now()
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			url, fail := c.start(t)
			runFailover(t, url, fail)
		})
	}
}

func runFailover(t *testing.T, url string, fail func(*apptest.App) time.Time) {
	// A global cap that does not bind, so the global day is held and settled too.
	policy := strings.Replace(apptest.PolicyYAML, "limits: {rpm: 3000, tpm: 300000}", "limits: {rpm: 6000, tpm: 600000}", 1) +
		"global_daily_budget_usd: 1000\n"
	a := apptest.Start(t, apptest.Options{RedisURL: url, Policy: policy, Sim: &sim.Config{
		Limits: sim.Limits{RPM: 60000, TPM: 6000000}, DefaultMaxTokens: 1024, Echo: true,
		Latency: 50 * time.Millisecond, Jitter: 50 * time.Millisecond,
	}})
	startProcess(t, a, "dispatcher", "LLMQ_LISTEN_ADDR=127.0.0.1:0").waitForOutput(t, "listening")
	for range 2 {
		startProcess(t, a, "worker", "LLMQ_WORKER_CONCURRENCY=20").waitForOutput(t, "worker running")
	}
	tenant, key := a.Tenant("standard")
	// The jobs are posted while Redis fails over: a POST it refuses (503
	// with Retry-After) is posted again, as a client does.
	type posted struct {
		ids []string
		err error
	}
	submitted := make(chan posted, 1)
	go func() {
		ids, err := postAll(t, a, key, failoverJobs, 4, 20)
		submitted <- posted{ids, err}
	}()
	eventually(t, time.Minute, func() bool { return a.Sim.Stats().Admitted >= failoverJobs/8 }, "an eighth of the jobs called")

	before := a.Sim.Stats().Admitted
	promoted := fail(a)
	atPromotion := a.Sim.Stats().Admitted
	var resumed time.Duration
	if atPromotion < failoverJobs {
		eventually(t, 30*time.Second, func() bool {
			if a.Sim.Stats().Admitted > atPromotion {
				resumed = time.Since(promoted)
				return true
			}
			return false
		}, "a provider call after the promotion")
	} // else every job was called while the replica was being promoted
	if resumed > 10*time.Second {
		t.Fatalf("the workers called the provider again %v after the promotion, want within 10s", resumed.Round(100*time.Millisecond))
	}
	p := <-submitted
	if p.err != nil {
		t.Fatal(p.err)
	}
	ids := p.ids

	jobs := allEnd(t, a, ids, 3*time.Minute)
	allDone := time.Since(promoted)
	for _, j := range jobs {
		if j.Status != store.JobSucceeded {
			t.Fatalf("job %s ended %s: %+v", j.ID, j.Status, j.Error)
		}
	}
	charged := chargedOnce(t, a, tenant, jobs)
	st := a.Sim.Stats()
	twice := st.Admitted - int64(len(ids))
	if twice < 0 || twice > 200 {
		t.Fatalf("the provider saw %d calls for %d jobs", st.Admitted, len(ids))
	}
	// The ledger's tokens are the provider's, less the calls made twice.
	var ledgerTokens int64
	for _, j := range jobs {
		ledgerTokens += j.PromptTokens + j.CompletionTokens
	}
	if provider := st.PromptTokens + st.CompletionTokens; provider < ledgerTokens {
		t.Fatalf("the ledger counts %d tokens, the provider %d", ledgerTokens, provider)
	}

	var u struct {
		SpentUSD  float64 `json:"spent_usd"`
		BudgetUSD float64 `json:"budget_usd"`
	}
	r := apptest.Do(t, a.URL, "GET", "/v1/usage", key, nil, nil)
	r.JSON(t, &u)
	if u.SpentUSD > u.BudgetUSD || u.SpentUSD < charged.USD()-1e-9 {
		t.Fatalf("usage after the failover: spent %v of %v; the ledger charged %v", u.SpentUSD, u.BudgetUSD, charged.USD())
	}
	d, err := a.Budgets.Status(t.Context(), a.Account(tenant))
	if err != nil {
		t.Fatal(err)
	}
	if d.GlobalSpent < charged || d.GlobalSpent > d.GlobalBudget {
		t.Fatalf("global day after the failover: spent %s of %s; the ledger charged %s", d.GlobalSpent, d.GlobalBudget, charged)
	}
	t.Logf("failover at %d of %d calls (%d before it): the workers called again %v after the promotion, every job ended %v after it; "+
		"%d jobs succeeded, each charged once ($%.6f); %d calls made twice (their writes lost); "+
		"Redis spend $%.6f (global day $%.6f), ledger $%.6f, budget $%.0f; provider tokens %d, ledger %d",
		atPromotion, len(ids), before, resumed.Round(100*time.Millisecond), allDone.Round(100*time.Millisecond), len(jobs), charged.USD(), twice,
		u.SpentUSD, d.GlobalSpent.USD(), charged.USD(), u.BudgetUSD, st.PromptTokens+st.CompletionTokens, ledgerTokens)
}
