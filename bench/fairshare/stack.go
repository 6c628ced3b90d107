package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/inproc"
	"github.com/llmq/llmq/internal/app"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/store"
)

// The two ways a stack orders its jobs.
const (
	modeFair   = "fair"     // the fair queue and its scheduler
	modeSingle = "baseline" // app.Parts.SingleQueue: every job to asynq at once, in arrival order
)

// The models: modelA is the one every scenario floods; modelB is the
// second model of the scenario across models.
const (
	modelA = "gpt-a"
	modelB = "gpt-b"
)

// policyYAML has one simulated provider, two models with the run's limits
// and tiers of share 1 and 3 at the default priority, and one at critical
// (whose jobs may ask for default or batch). Budgets and the API's limits
// never bind.
const policyYAML = `
providers:
  - name: sim
    base_url: {{SIM}}
    api_key_env: SIM_API_KEY
    timeout: 30s
models:
  - name: gpt-a
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: {{RPM}}, tpm: {{TPM}}}
    max_output_tokens: 1024
  - name: gpt-b
    provider: sim
    price: {input_per_mtok: 0.15, output_per_mtok: 0.60}
    limits: {rpm: {{RPM}}, tpm: {{TPM}}}
    max_output_tokens: 1024
tiers:
  - name: one
    daily_budget_usd: 1000000
    priority: default
    on_exhausted: defer
    api_rps: 1000000
    share: 1
  - name: three
    daily_budget_usd: 1000000
    priority: default
    on_exhausted: defer
    api_rps: 1000000
    share: 3
  - name: premium
    daily_budget_usd: 1000000
    priority: critical
    on_exhausted: defer
    api_rps: 1000000
`

// stack is one llmq in one mode over a schema, a Redis prefix and queue
// namespace of its own, its API on loopback, in-process workers, and a
// simulated provider of its own.
type stack struct {
	mode   string
	o      *options
	app    *app.App
	sim    *sim.TestServer
	obs    *observer
	url    string
	client *http.Client
	closes benchenv.Closers
}

// openStack starts a stack in mode; close stops it.
func openStack(ctx context.Context, o *options, mode string, logger *slog.Logger) (_ *stack, err error) {
	s := &stack{mode: mode, o: o, obs: newObserver()}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	s.sim = sim.Start(sim.Config{
		Limits:           sim.Limits{RPM: o.RPM, TPM: o.TPM},
		DefaultMaxTokens: 1024,
		Latency:          o.Latency,
		Jitter:           o.Jitter,
		// Every completion is max_tokens long: what a call is charged is
		// what it uses, so tokens per tenant are exact from the usage.
		CompletionMin: 1, CompletionMax: 1,
		Seed: 1,
	})
	s.closes = append(s.closes, s.sim.Close)

	l, err := inproc.Open(ctx, inproc.Options{Backends: o.Backends, Name: "fair", Policy: policyYAML, SimURL: s.sim.BaseURL,
		RPM: o.RPM, TPM: o.TPM, Environ: benchenv.Environ{Concurrency: o.Concurrency, ShutdownTimeout: 3 * time.Second},
		Parts: app.Parts{SingleQueue: mode == modeSingle}}, logger, &s.closes)
	if err != nil {
		return nil, err
	}
	a := l.App
	a.Observer = s.obs
	s.app = a

	// The dispatcher's background work: the scheduler (it has nothing to
	// release in the baseline) and the batch sweeper.
	s.closes = append(s.closes, inproc.Loops(a.Scheduler().Run, a.Batches.Run))
	url, closeAPI, err := inproc.ServeAPI(a)
	if err != nil {
		return nil, err
	}
	s.closes = append(s.closes, closeAPI)
	s.url = url
	tr := &http.Transport{MaxIdleConns: 16, MaxIdleConnsPerHost: 16}
	s.closes = append(s.closes, tr.CloseIdleConnections)
	s.client = &http.Client{Transport: tr, Timeout: time.Minute}
	return s, nil
}

// startWorkers starts the stack's worker (one asynq server of the run's
// concurrency), counting every job task it dequeues.
func (s *stack) startWorkers() error {
	shutdown, err := inproc.StartWorker(s.app, func(h asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			if t.Type() == "llmq:job" {
				s.obs.dequeues.Add(1)
			}
			return h.ProcessTask(ctx, t)
		})
	})
	if err != nil {
		return err
	}
	s.closes = append(s.closes, shutdown)
	return nil
}

// close stops everything, in reverse order.
func (s *stack) close() { s.closes.Close() }

// tenant is one tenant of the stack and its key.
type tenant struct {
	ID, Key, Tier string
}

// newTenant creates a tenant of tier with one key, through the admin API.
func (s *stack) newTenant(ctx context.Context, name, tier string) (*tenant, error) {
	body, _ := json.Marshal(map[string]string{"name": name, "tier": tier})
	status, resp, err := s.do(ctx, "POST", "/admin/v1/tenants", benchenv.AdminToken, "application/json", body)
	if err != nil {
		return nil, err
	}
	var t struct {
		ID string `json:"id"`
	}
	if status != http.StatusCreated || json.Unmarshal(resp, &t) != nil {
		return nil, fmt.Errorf("create tenant: %d %s", status, resp)
	}
	status, resp, err = s.do(ctx, "POST", "/admin/v1/tenants/"+t.ID+"/keys", benchenv.AdminToken, "application/json", nil)
	if err != nil {
		return nil, err
	}
	var k struct {
		Key string `json:"key"`
	}
	if status != http.StatusCreated || json.Unmarshal(resp, &k) != nil || k.Key == "" {
		return nil, fmt.Errorf("create key: %d %s", status, resp)
	}
	return &tenant{ID: t.ID, Key: k.Key, Tier: tier}, nil
}

func (s *stack) do(ctx context.Context, method, path, token, ctype string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, s.url+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// submission is one job POSTed: its id and when the POST was sent.
type submission struct {
	ID string
	At time.Time
}

// post POSTs the jobs of each spec in turn, from a few goroutines keeping
// the order roughly (each takes the next one): the arrival order is the
// order of specs.
func (s *stack) post(ctx context.Context, specs []jobSpec) ([]submission, error) {
	out := make([]submission, len(specs))
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(specs) || cctx.Err() != nil {
					return
				}
				sp := specs[i]
				out[i].At = time.Now()
				status, body, err := s.do(cctx, "POST", "/v1/jobs", sp.Tenant.Key, "application/json", sp.body())
				if err == nil && status != http.StatusAccepted {
					err = fmt.Errorf("POST /v1/jobs: %d %s", status, body)
				}
				var job struct {
					ID string `json:"id"`
				}
				if err == nil && (json.Unmarshal(body, &job) != nil || job.ID == "") {
					err = fmt.Errorf("POST /v1/jobs: no job id in %s", body)
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					cancel()
					return
				}
				out[i].ID = job.ID
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return nil, err
	default:
	}
	return out, ctx.Err()
}

// finished reads the jobs of subs, and returns for each the time from its
// submission to its success (0: not succeeded yet) and how many succeeded.
func (s *stack) finished(ctx context.Context, subs []submission) ([]time.Duration, int, error) {
	out := make([]time.Duration, len(subs))
	n := 0
	for i, sb := range subs {
		j, err := s.app.Store.JobGetByID(ctx, sb.ID)
		if err != nil {
			return nil, 0, err
		}
		if j.Status == store.JobSucceeded && j.FinishedAt != nil {
			out[i] = max(j.FinishedAt.Sub(sb.At), time.Millisecond)
			n++
		}
	}
	return out, n, nil
}

// waitSucceeded polls subs until all succeeded or limit passed, and
// returns each one's time to success (0: not within limit).
func (s *stack) waitSucceeded(ctx context.Context, subs []submission, limit time.Duration) ([]time.Duration, int, error) {
	deadline := time.Now().Add(limit)
	for {
		d, n, err := s.finished(ctx, subs)
		if err != nil || n == len(subs) || time.Now().After(deadline) {
			return d, n, err
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return nil, 0, err
		}
	}
}

// countQueued is how many of tenant's jobs have not started yet.
func (s *stack) countQueued(ctx context.Context, tenantID string) (int, error) {
	n := 0
	after := ""
	for {
		page, more, err := s.app.Store.JobList(ctx, &store.JobListParams{TenantID: tenantID, Status: store.JobQueued, After: after, Limit: 1000})
		if err != nil {
			return 0, err
		}
		n += len(page)
		if !more || len(page) == 0 {
			return n, nil
		}
		after = page[len(page)-1].ID
	}
}

// submitBatch uploads the lines of specs as one batch file of tenant t and
// creates the batch; it returns the batch id.
func (s *stack) submitBatch(ctx context.Context, t *tenant, specs []jobSpec) (string, error) {
	var file bytes.Buffer
	for i, sp := range specs {
		line, _ := json.Marshal(map[string]any{"custom_id": "r" + strconv.Itoa(i), "method": "POST", "url": "/v1/chat/completions",
			"body": json.RawMessage(sp.requestBody())})
		file.Write(line)
		file.WriteByte('\n')
	}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "lines.jsonl")
	_, _ = fw.Write(file.Bytes())
	_ = mw.Close()
	status, resp, err := s.do(ctx, "POST", "/v1/files", t.Key, mw.FormDataContentType(), body.Bytes())
	if err != nil {
		return "", err
	}
	var f struct {
		ID string `json:"id"`
	}
	if status != http.StatusOK || json.Unmarshal(resp, &f) != nil {
		return "", fmt.Errorf("upload: %d %s", status, resp)
	}
	req, _ := json.Marshal(map[string]string{"input_file_id": f.ID, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
	status, resp, err = s.do(ctx, "POST", "/v1/batches", t.Key, "application/json", req)
	if err != nil {
		return "", err
	}
	var b struct {
		ID string `json:"id"`
	}
	if status != http.StatusOK || json.Unmarshal(resp, &b) != nil {
		return "", fmt.Errorf("create batch: %d %s", status, resp)
	}
	return b.ID, nil
}

// batchState is what GET /v1/batches/{id} says of a batch.
type batchState struct {
	Status        string `json:"status"`
	RequestCounts struct {
		Total     int `json:"total"`
		Completed int `json:"completed"`
		Failed    int `json:"failed"`
	} `json:"request_counts"`
}

func (s *stack) batch(ctx context.Context, t *tenant, id string) (*batchState, error) {
	status, resp, err := s.do(ctx, "GET", "/v1/batches/"+id, t.Key, "", nil)
	if err != nil {
		return nil, err
	}
	var b batchState
	if status != http.StatusOK || json.Unmarshal(resp, &b) != nil {
		return nil, fmt.Errorf("get batch: %d %s", status, resp)
	}
	return &b, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
