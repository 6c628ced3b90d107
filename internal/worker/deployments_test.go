package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/worker"
)

// deployments is a test app whose gpt-4o-mini runs on deployments a and b
// (each its own simulated provider, b dearer) and falls back to model
// small on provider c; shape fills in the deployments' order and weight.
type deployments struct {
	*apptest.App
	a, b, c *sim.TestServer
}

func startDeployments(t *testing.T, shape string) *deployments {
	t.Helper()
	d := &deployments{}
	servers := map[string]**sim.TestServer{"{{A}}": &d.a, "{{B}}": &d.b, "{{C}}": &d.c}
	policy := `
providers:
  - {name: a, base_url: "{{A}}", api_key_env: SIM_API_KEY}
  - {name: b, base_url: "{{B}}", api_key_env: SIM_API_KEY}
  - {name: c, base_url: "{{C}}", api_key_env: SIM_API_KEY}
  - {name: sim, base_url: "{{SIM}}", api_key_env: SIM_API_KEY}
models:
  - name: gpt-4o-mini
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    max_output_tokens: 1024
    deployments:
` + shape + `
    fallbacks: [small]
  - name: small
    provider: c
    upstream: gpt-4o-mini
    price: {input_per_mtok: 1.00, output_per_mtok: 2.00}
    limits: {rpm: 3000, tpm: 300000}
    max_output_tokens: 1024
  - name: other
    provider: c
    upstream: other-model
    price: {input_per_mtok: 2.00, output_per_mtok: 4.00}
    limits: {rpm: 3000, tpm: 300000}
    max_output_tokens: 1024
` + strings.Replace(apptest.PolicyYAML[strings.Index(apptest.PolicyYAML, "tiers:"):],
		"  - name: standard\n", "  - name: standard\n    fallbacks: [other]\n", 1)
	for mark, srv := range servers {
		// The accounts' limits are well above the policy's: the policy's
		// pace the calls.
		*srv = sim.Start(sim.Config{Limits: sim.Limits{RPM: 60000, TPM: 6000000}, DefaultMaxTokens: 1024, Echo: true})
		t.Cleanup((*srv).Close)
		policy = strings.ReplaceAll(policy, mark, (*srv).BaseURL)
	}
	// A failing deployment's pause outlasts the test: its calls are
	// counted, whatever the machine's speed.
	d.App = apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: policy,
		Env: func(e *config.Env) { e.FaultPause = time.Minute }})
	return d
}

const orderedShape = `      - {provider: a, upstream: gpt-4o-mini, limits: {rpm: 3000, tpm: 300000}, order: 1}
      - {provider: b, upstream: gpt-4o-mini, limits: {rpm: 3000, tpm: 300000}, order: 2, price: {input_per_mtok: 0.30, output_per_mtok: 1.20}}`

// runJobs submits n jobs and runs each once on h, in turn.
func (d *deployments) runJobs(t *testing.T, h *worker.Handler, n int) []*store.Job {
	t.Helper()
	_, key := d.Tenant("standard")
	out := make([]*store.Job, n)
	for i := range out {
		id := submit(t, d.App, key, map[string]any{"body": apptest.ChatBody("hello there", "", 20)})
		if err := h.Run(context.Background(), id); err != nil {
			t.Fatalf("run %s: %v", id, err)
		}
		out[i] = job(t, d.App, id)
	}
	return out
}

// checkServed checks that job j succeeded after one call, on deployment,
// as model, charged its usage at price in the job and the ledger alike.
func checkServed(t *testing.T, d *deployments, j *store.Job, model, deployment string, price money.Price) {
	t.Helper()
	if j.Status != store.JobSucceeded || j.Attempts != 1 || j.RateLimited != 0 {
		t.Fatalf("job %s: %s after %d attempts (%d 429s), error %+v; want succeeded after one", j.ID, j.Status, j.Attempts, j.RateLimited, j.Error)
	}
	if j.Deployment != deployment || j.ServedModel != model {
		t.Fatalf("job %s served by %s of %s, want %s of %s", j.ID, j.Deployment, j.ServedModel, deployment, model)
	}
	want := price.Cost(money.Tokens{Prompt: j.PromptTokens, Cached: j.CachedTokens, Completion: j.CompletionTokens})
	e, err := d.Store.UsageGetByJob(context.Background(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.Cost != want || e.Cost != want || e.Deployment != deployment || e.Model != model || want <= 0 {
		t.Fatalf("job %s charged %d, ledger %+v; want %d on %s as %s", j.ID, j.Cost, e, want, deployment, model)
	}
}

func priceOf(t *testing.T, d *deployments, model, deployment string) money.Price {
	t.Helper()
	m, _ := d.Policy.Current().Model(model)
	r, ok := m.Route(deployment)
	if !ok {
		t.Fatalf("no deployment %s of %s", deployment, model)
	}
	return r.Price
}

// Jobs go to the lowest order that can take them: with room everywhere,
// deployment b, of order 2, gets nothing.
func TestDeploymentsFillInOrder(t *testing.T) {
	t.Parallel()
	d := startDeployments(t, orderedShape)
	h := d.JobHandler(worker.Options{})
	for _, j := range d.runJobs(t, h, 10) {
		checkServed(t, d, j, "gpt-4o-mini", "a/gpt-4o-mini", priceOf(t, d, "gpt-4o-mini", "a/gpt-4o-mini"))
	}
	if n := d.b.Stats().Requests; n != 0 {
		t.Fatalf("deployment b had %d calls, want none", n)
	}
}

// Among deployments of one order, jobs spread in proportion to their
// weights.
func TestDeploymentsSpreadByWeight(t *testing.T) {
	t.Parallel()
	// Limits high enough that no deployment's pace (a call every 1ms) ever
	// sends a job to the other: only the weights choose.
	d := startDeployments(t, `      - {provider: a, upstream: gpt-4o-mini, limits: {rpm: 60000, tpm: 6000000}, weight: 1}
      - {provider: b, upstream: gpt-4o-mini, limits: {rpm: 60000, tpm: 6000000}, weight: 3}`)
	const n = 120
	d.runJobs(t, d.JobHandler(worker.Options{}), n)
	a, b := d.a.Stats().Requests, d.b.Stats().Requests
	// 3 in 4 to b: 90 ± 4.7 (one standard deviation).
	if a+b != n || b < 72 || b > 108 {
		t.Fatalf("a %d, b %d calls; want %d in all, about 90 on b", a, b, n)
	}
}

// A deployment that fails a call is paused for every worker: the job and
// the next ones go to the next deployment, without counting a failure, and
// no call goes to the failing one until its pause ends; then one probe
// readmits it.
func TestDeploymentFailover(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		faults sim.Faults
		down   bool
	}{
		{"500", sim.Faults{Rate500: 1}, false},
		{"429", sim.Faults{Rate429: 1, RetryAfter429: 30_000_000_000}, false},
		{"refused", sim.Faults{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := startDeployments(t, orderedShape)
			if c.down {
				d.a.Down()
			} else if err := d.a.SetFaults(c.faults); err != nil {
				t.Fatal(err)
			}
			h := d.JobHandler(worker.Options{})
			bPrice := priceOf(t, d, "gpt-4o-mini", "b/gpt-4o-mini")
			for _, j := range d.runJobs(t, h, 10) {
				checkServed(t, d, j, "gpt-4o-mini", "b/gpt-4o-mini", bPrice)
			}
			if got := d.a.Stats().Errors500 + d.a.Stats().RateLimited + d.a.Stats().Spurious429; !c.down && got != 1 {
				t.Fatalf("deployment a answered %d failures, want one: it is paused after the first", got)
			}
			m, _ := d.Policy.Current().Model("gpt-4o-mini")
			route, _ := m.Route("a/gpt-4o-mini")
			st, err := d.Limiter.State(context.Background(), admission.Scope(route))
			if err != nil {
				t.Fatal(err)
			}
			if !st.Penalized {
				t.Fatal("deployment a is not paused")
			}
			if c.name == "500" {
				// After the pause, one probe finds it well again.
				if err := d.a.SetFaults(sim.Faults{}); err != nil {
					t.Fatal(err)
				}
				clearPause(t, d, route)
				for _, j := range d.runJobs(t, h, 3) {
					checkServed(t, d, j, "gpt-4o-mini", "a/gpt-4o-mini", priceOf(t, d, "gpt-4o-mini", "a/gpt-4o-mini"))
				}
			}
		})
	}
}

// clearPause forgets route's limiter state (its pause), as if the pause
// and the probe after it had passed (the limiter's tests show the probe).
func clearPause(t *testing.T, d *deployments, route config.Route) {
	t.Helper()
	if err := d.Redis.Del(context.Background(), d.Keys.LimiterScope(admission.Scope(route).Name)).Err(); err != nil {
		t.Fatal(err)
	}
}

// With every deployment failing, jobs run on the fallback model, charged
// at its price; a request too long for the model's context goes to the
// fallback too.
func TestFallbackModel(t *testing.T) {
	t.Parallel()
	d := startDeployments(t, orderedShape)
	for _, s := range []*sim.TestServer{d.a, d.b} {
		if err := s.SetFaults(sim.Faults{Rate500: 1}); err != nil {
			t.Fatal(err)
		}
	}
	h := d.JobHandler(worker.Options{})
	small := priceOf(t, d, "small", "c/gpt-4o-mini")
	for _, j := range d.runJobs(t, h, 5) {
		checkServed(t, d, j, "small", "c/gpt-4o-mini", small)
	}
	if a, b := d.a.Stats().Errors500, d.b.Stats().Errors500; a != 1 || b != 1 {
		t.Fatalf("a and b answered %d and %d 500s, want one each: paused after it", a, b)
	}
}

// A job's own fallbacks replace its model's.
func TestJobOwnFallback(t *testing.T) {
	t.Parallel()
	d := startDeployments(t, orderedShape)
	for _, s := range []*sim.TestServer{d.a, d.b} {
		if err := s.SetFaults(sim.Faults{Rate500: 1}); err != nil {
			t.Fatal(err)
		}
	}
	_, key := d.Tenant("standard")
	id := submit(t, d.App, key, map[string]any{"body": apptest.ChatBody("hello there", "", 20), "fallbacks": []string{"other"}})
	if err := d.JobHandler(worker.Options{}).Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	checkServed(t, d, job(t, d.App, id), "other", "c/other-model", priceOf(t, d, "other", "c/other-model"))
}

func TestFallbackOnContextLength(t *testing.T) {
	t.Parallel()
	d := startDeployments(t, orderedShape)
	if err := d.a.SetContextWindow("gpt-4o-mini", 100); err != nil {
		t.Fatal(err)
	}
	h := d.JobHandler(worker.Options{})
	_, key := d.Tenant("standard")
	id := submit(t, d.App, key, map[string]any{"body": apptest.ChatBody("hello there", "", 200)})
	if err := h.Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	checkServed(t, d, job(t, d.App, id), "small", "c/gpt-4o-mini", priceOf(t, d, "small", "c/gpt-4o-mini"))
	if n := d.b.Stats().Requests; n != 0 {
		t.Fatalf("deployment b had %d calls: a context too long for the model goes to its fallback", n)
	}
}

// A synchronous request routes and fails over as a job does.
func TestSyncRequestFailsOver(t *testing.T) {
	t.Parallel()
	d := startDeployments(t, orderedShape)
	d.a.Down()
	_, key := d.Tenant("standard")
	for range 3 {
		if r := d.Do("POST", "/v1/chat/completions", key, apptest.ChatBody("hello there", "", 20)); r.Status != 200 {
			t.Fatalf("sync request: %d %s", r.Status, r.Body)
		}
	}
	if n := d.b.Stats().Admitted; n != 3 {
		t.Fatalf("deployment b answered %d requests, want 3", n)
	}
}

// A job whose every deployment and fallback fail waits for one to come
// back without counting a failure, for OutageWait from its creation; past
// it, the faults count as a single provider's do.
func TestEveryDeploymentDownWaits(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		wait    time.Duration
		failure bool
	}{{"within", 0, false}, {"past", time.Nanosecond, true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := startDeployments(t, orderedShape)
			for _, s := range []*sim.TestServer{d.a, d.b, d.c} {
				if err := s.SetFaults(sim.Faults{Rate500: 1}); err != nil {
					t.Fatal(err)
				}
			}
			_, key := d.Tenant("standard")
			id := submit(t, d.App, key, map[string]any{"body": apptest.ChatBody("hello there", "", 20)})
			err := d.JobHandler(worker.Options{OutageWait: c.wait}).Run(context.Background(), id)
			var retry *queue.Retry
			if !errors.As(err, &retry) || retry.Failure != c.failure {
				t.Fatalf("run: %v; want a retry, counted as a failure: %v", err, c.failure)
			}
			j := job(t, d.App, id)
			if j.Status != store.JobWaiting {
				t.Fatalf("job %s, want waiting", j.Status)
			}
			if calls := d.a.Stats().Errors500 + d.b.Stats().Errors500 + d.c.Stats().Errors500; calls != 3 {
				t.Fatalf("%d calls, want one on each deployment", calls)
			}
		})
	}
}
