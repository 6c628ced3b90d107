package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/hibiken/asynq"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	openai "github.com/sashabaranov/go-openai"
	"github.com/tiktoken-go/tokenizer"

	"github.com/llmq/llmq/bench/internal/benchenv"
	"github.com/llmq/llmq/bench/internal/cost"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/testutil"
)

// The hand-wired stack is what a team would wire in a day from the parts
// llmq is built on, as the baseline llmq is measured against: net/http for
// the API, a jobs table in Postgres through pgx, asynq for the queue,
// go-redis with redis_rate for the provider's RPM and TPM, go-openai to call
// the provider, tiktoken to count a prompt's tokens. It keeps the same
// promises to its client as llmq where a client can see them (a job is in
// the table before the POST answers; its result is committed before its task
// is acked; the client reads the job's status from the table), and none of
// llmq's others: no budgets, no ledger, no per-tenant limits or fair share,
// no recovery of stuck jobs, no webhooks. Its one API key is compared in
// memory, where llmq looks a tenant's key up.

const hwSchema = `
CREATE TABLE jobs (
	id                text PRIMARY KEY,
	status            text NOT NULL,
	model             text NOT NULL,
	request           jsonb NOT NULL,
	response          jsonb,
	error             text,
	prompt_tokens     int NOT NULL DEFAULT 0,
	completion_tokens int NOT NULL DEFAULT 0,
	created_at        timestamptz NOT NULL DEFAULT now(),
	started_at        timestamptz,
	finished_at       timestamptz
)`

const hwTaskType = "hw:chat"

// hwLimits are the provider's limits as the stack knows them: as in llmq's
// policy, far above what the machine can push.
var hwLimits = struct{ rpm, tpm int }{rpm: 10_000_000, tpm: 1_000_000_000}

type handWired struct {
	o       *options
	pool    *pgxpool.Pool
	rdb     *redis.Client
	meter   *meter
	client  *asynq.Client
	qname   string
	prefix  string // redis_rate's keys
	limiter *redis_rate.Limiter
	llm     *openai.Client
	enc     tokenizer.Codec
	key     string
	target  *target
	servers []*asynq.Server
}

// openHandWired starts the stack on a schema and a queue of its own, its API
// on a loopback listener, its workers running, calling the simulator at
// baseURL. The function returned stops it.
func openHandWired(ctx context.Context, o *options, baseURL string, logger *slog.Logger) (_ *handWired, _ func(), err error) {
	var closers benchenv.Closers
	closeAll := closers.Close
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	h := &handWired{o: o, key: "hw-" + testutil.RandomHex(16)}

	dsn, drop, err := testutil.NewSchema(ctx, o.DatabaseURL, "bench_hw_")
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, drop)
	cfg, err := pgxpool.ParseConfig(testutil.PlainDSN(dsn))
	if err != nil {
		return nil, nil, err
	}
	cfg.MaxConns = 16 // llmq's store pool
	if h.pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		return nil, nil, err
	}
	closers = append(closers, h.pool.Close)
	if _, err := h.pool.Exec(ctx, hwSchema); err != nil {
		return nil, nil, fmt.Errorf("schema: %w", err)
	}

	rdb, _, rt, err := newRedis(ctx, o.RedisURL, o.RedisDB)
	if err != nil {
		return nil, nil, err
	}
	h.rdb = rdb
	closers = append(closers, func() { _ = rdb.Close() })
	h.meter = &meter{rt: rt, cpu: cost.NewCPUReader(rdb, o.DatabaseURL)}
	ns := "bench-hw-" + testutil.RandomHex(4)
	h.qname, h.prefix = ns+":default", ns
	closers = append(closers, func() { testutil.PurgeRedis(rdb, []string{h.qname}, h.prefix) })
	h.limiter = redis_rate.NewLimiter(rdb)
	h.client = asynq.NewClientFromRedisClient(rdb)

	if h.enc, err = tokenizer.Get(tokenizer.O200kBase); err != nil {
		return nil, nil, err
	}
	oc := openai.DefaultConfig("bench")
	oc.BaseURL = baseURL
	oc.HTTPClient = &http.Client{Transport: &http.Transport{MaxIdleConns: o.Concurrency, MaxIdleConnsPerHost: o.Concurrency}}
	h.llm = openai.NewClientWithConfig(oc)

	mux := asynq.NewServeMux()
	mux.HandleFunc(hwTaskType, h.process)
	for range o.Servers {
		srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
			Concurrency:              o.perServer(),
			Queues:                   map[string]int{h.qname: 1},
			TaskCheckInterval:        pollInterval,
			DelayedTaskCheckInterval: delayedInterval,
			ShutdownTimeout:          5 * time.Second,
			Logger:                   asynqLogger{logger},
			LogLevel:                 asynq.WarnLevel,
		})
		if err := srv.Start(mux); err != nil {
			return nil, nil, err
		}
		closers = append(closers, srv.Shutdown)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	api := http.NewServeMux()
	api.HandleFunc("POST /v1/jobs", h.authed(h.createJob))
	api.HandleFunc("GET /v1/jobs/{id}", h.authed(h.getJob))
	hs := &http.Server{Handler: api, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	closers = append(closers, func() { _ = hs.Close() })
	h.target = newTarget("http://"+ln.Addr().String(), h.key, 2*o.Producers)
	closers = append(closers, h.target.close)
	return h, closeAll, nil
}

func hwError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"message": msg, "type": "invalid_request_error"}})
}

func (h *handWired) authed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+h.key {
			hwError(w, http.StatusUnauthorized, "invalid API key")
			return
		}
		next(w, r)
	}
}

// createJob validates the request, inserts the job and enqueues its task.
func (h *handWired) createJob(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Body json.RawMessage `json:"body"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&in); err != nil {
		hwError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
		return
	}
	var req openai.ChatCompletionRequest
	if err := json.Unmarshal(in.Body, &req); err != nil || req.Model == "" || len(req.Messages) == 0 {
		hwError(w, http.StatusBadRequest, "body must be a chat completion request with a model and messages")
		return
	}
	id := ids.New(ids.Job)
	ctx := r.Context()
	if _, err := h.pool.Exec(ctx, `INSERT INTO jobs (id, status, model, request) VALUES ($1, 'queued', $2, $3)`,
		id, req.Model, []byte(in.Body)); err != nil {
		hwError(w, http.StatusInternalServerError, "database error")
		return
	}
	if _, err := h.client.EnqueueContext(ctx, asynq.NewTask(hwTaskType, []byte(id)),
		asynq.TaskID(id), asynq.Queue(h.qname), asynq.MaxRetry(8), asynq.Timeout(30*time.Minute)); err != nil {
		hwError(w, http.StatusInternalServerError, "queue error")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "object": "job", "status": "queued", "model": req.Model})
}

// hwJob is a job as the stack's API renders it.
type hwJob struct {
	ID               string          `json:"id"`
	Object           string          `json:"object"`
	Status           string          `json:"status"`
	Model            string          `json:"model"`
	Response         json.RawMessage `json:"response"`
	Error            *string         `json:"error"`
	PromptTokens     int             `json:"prompt_tokens"`
	CompletionTokens int             `json:"completion_tokens"`
	CreatedAt        int64           `json:"created_at"`
	FinishedAt       *int64          `json:"finished_at"`
}

func (h *handWired) getJob(w http.ResponseWriter, r *http.Request) {
	j := hwJob{Object: "job"}
	var created time.Time
	var finished *time.Time
	err := h.pool.QueryRow(r.Context(), `SELECT id, status, model, response, error, prompt_tokens, completion_tokens, created_at, finished_at
		FROM jobs WHERE id = $1`, r.PathValue("id")).Scan(&j.ID, &j.Status, &j.Model, &j.Response, &j.Error,
		&j.PromptTokens, &j.CompletionTokens, &created, &finished)
	if errors.Is(err, pgx.ErrNoRows) {
		hwError(w, http.StatusNotFound, "no such job")
		return
	}
	if err != nil {
		hwError(w, http.StatusInternalServerError, "database error")
		return
	}
	j.CreatedAt = created.Unix()
	if finished != nil {
		u := finished.Unix()
		j.FinishedAt = &u
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(j)
}

// process runs one job: marks it running (reading its request), takes its
// RPM and TPM from redis_rate, calls the provider and commits the result.
func (h *handWired) process(ctx context.Context, t *asynq.Task) error {
	id := string(t.Payload())
	var raw []byte
	err := h.pool.QueryRow(ctx, `UPDATE jobs SET status = 'running', started_at = now() WHERE id = $1 AND status IN ('queued', 'running') RETURNING request`, id).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // finished already (a redelivery)
	}
	if err != nil {
		return err
	}
	var req openai.ChatCompletionRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return h.finish(ctx, id, nil, err.Error(), 0, 0)
	}
	tokens := req.MaxTokens
	for _, m := range req.Messages {
		n, err := h.enc.Count(m.Content)
		if err != nil {
			return err
		}
		tokens += n + 4
	}
	if err := h.take(ctx, req.Model, tokens); err != nil {
		return err
	}
	resp, err := h.llm.CreateChatCompletion(ctx, req)
	if err != nil {
		var apiErr *openai.APIError
		if errors.As(err, &apiErr) && apiErr.HTTPStatusCode >= 400 && apiErr.HTTPStatusCode < 500 && apiErr.HTTPStatusCode != 429 {
			return h.finish(ctx, id, nil, apiErr.Message, 0, 0)
		}
		return err // asynq retries it
	}
	body, err := json.Marshal(resp)
	if err != nil {
		return err
	}
	return h.finish(ctx, id, body, "", resp.Usage.PromptTokens, resp.Usage.CompletionTokens)
}

// take waits until redis_rate admits one request and tokens tokens of
// model's limits.
func (h *handWired) take(ctx context.Context, model string, tokens int) error {
	for _, l := range []struct {
		key   string
		limit redis_rate.Limit
		n     int
	}{
		{h.prefix + ":rpm:" + model, redis_rate.PerMinute(hwLimits.rpm), 1},
		{h.prefix + ":tpm:" + model, redis_rate.Limit{Rate: hwLimits.tpm, Burst: hwLimits.tpm, Period: time.Minute}, tokens},
	} {
		for {
			res, err := h.limiter.AllowN(ctx, l.key, l.limit, l.n)
			if err != nil {
				return err
			}
			if res.Allowed > 0 {
				break
			}
			select {
			case <-time.After(res.RetryAfter):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

func (h *handWired) finish(ctx context.Context, id string, response []byte, errMsg string, prompt, completion int) error {
	status := "succeeded"
	var e *string
	if errMsg != "" {
		status, e = "failed", &errMsg
	}
	_, err := h.pool.Exec(ctx, `UPDATE jobs SET status = $2, response = $3, error = $4, prompt_tokens = $5, completion_tokens = $6, finished_at = now() WHERE id = $1`,
		id, status, response, e, prompt, completion)
	return err
}
