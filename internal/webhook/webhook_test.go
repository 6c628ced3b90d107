package webhook_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/webhook"
	"github.com/llmq/llmq/internal/worker"
)

func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m)
}

// redisDB is this package's Redis database (docs/ARCHITECTURE.md).
const redisDB = 8

// allowPrivate lets the API take the receivers' loopback URLs, which it
// refuses at submit otherwise: these tests deliver with handlers of their
// own, whose AllowPrivate says what delivery does.
func allowPrivate(e *config.Env) { e.WebhookAllowPrivate = true }

// receiver is a webhook endpoint recording what it gets.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []delivery
	status int
}

type delivery struct {
	header http.Header
	body   []byte
}

func newReceiver(t *testing.T, status int) *receiver {
	r := &receiver{status: status}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, delivery{req.Header.Clone(), b})
		st := r.status
		r.mu.Unlock()
		if st == http.StatusFound {
			http.Redirect(w, req, "http://169.254.169.254/latest/meta-data/", st)
			return
		}
		w.WriteHeader(st)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

// finishedJob creates a job with a webhook and runs it to success.
func finishedJob(t *testing.T, a *apptest.App, key, hook string) *store.Job {
	t.Helper()
	r := a.Do("POST", "/v1/jobs", key, map[string]any{"webhook_url": hook, "body": apptest.ChatBody("hi", "", 5)})
	if r.Status != 202 {
		t.Fatalf("create job: %d %s", r.Status, r.Body)
	}
	id := r.Map(t)["id"].(string)
	if err := a.JobHandler(worker.Options{}).Run(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	j, err := a.Store.JobGetByID(context.Background(), id)
	if err != nil || j.Status != store.JobSucceeded {
		t.Fatalf("job = %+v, %v", j, err)
	}
	return j
}

func secretOf(t *testing.T, a *apptest.App, tenantID string) string {
	t.Helper()
	var ten client.Tenant
	a.Do("GET", "/admin/v1/tenants/"+tenantID, apptest.AdminToken, nil).JSON(t, &ten)
	if !strings.HasPrefix(ten.WebhookSecret, "whsec_") {
		t.Fatalf("tenant = %+v", ten)
	}
	return ten.WebhookSecret
}

// readmeVerify is the README's recipe, line by line, written apart from
// the package (which signs and verifies with shared code): split the header
// on commas, each part on its first "="; t is the first "t"; the signature
// is hex(HMAC-SHA256(secret, t + "." + body)), compared with every "v1".
func readmeVerify(secret, header string, body []byte, now time.Time, tolerance time.Duration) bool {
	var parts [][2]string
	for _, p := range strings.Split(header, ",") {
		if k, v, ok := strings.Cut(p, "="); ok {
			parts = append(parts, [2]string{k, v})
		}
	}
	ts := ""
	for _, p := range parts {
		if p[0] == "t" {
			ts = p[1]
			break
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || now.Sub(time.Unix(sec, 0)).Abs() > tolerance {
		return false
	}
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "." + string(body)))
	want := hex.EncodeToString(mac.Sum(nil))
	for _, p := range parts {
		if p[0] == "v1" && hmac.Equal([]byte(p[1]), []byte(want)) {
			return true
		}
	}
	return false
}

// checkReadmeRecipe verifies a delivered request, its one signature header
// and its raw body, with the README's recipe, and checks that the recipe
// refuses the same header over another body or with another secret.
func checkReadmeRecipe(t *testing.T, secret string, d delivery) {
	t.Helper()
	hs := d.header.Values("X-Llmq-Signature")
	if len(hs) != 1 || !strings.HasPrefix(hs[0], "t=") || !strings.Contains(hs[0], ",v1=") {
		t.Fatalf("X-Llmq-Signature = %q, want one t=<unix>,v1=<hex>", hs)
	}
	now := time.Now()
	if !readmeVerify(secret, hs[0], d.body, now, 5*time.Minute) {
		t.Fatalf("the README's recipe refuses the delivery: header %q, body %s", hs[0], d.body)
	}
	tampered := append([]byte(nil), d.body...)
	tampered[len(tampered)-1] ^= 1
	if readmeVerify(secret, hs[0], tampered, now, 5*time.Minute) || readmeVerify(secret+"x", hs[0], d.body, now, 5*time.Minute) {
		t.Fatal("the README's recipe accepts another body or secret: it checks nothing")
	}
}

func task(kind, id string) *asynq.Task {
	b, _ := json.Marshal(queue.WebhookPayload{Kind: kind, ID: id})
	return asynq.NewTask(queue.TypeWebhook, b)
}

// TestJobWebhookIsSignedAndVerifies delivers a job's webhook the way a worker
// does, and checks it with the documented recipe.
func TestJobWebhookIsSignedAndVerifies(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Env: allowPrivate})
	tenantID, key := a.Tenant("standard")
	rcv := newReceiver(t, http.StatusNoContent)
	j := finishedJob(t, a, key, rcv.URL+"/hooks/llmq?token=abc")

	h := webhook.NewHandler(webhook.Deps{Store: a.Store}, webhook.Options{AllowPrivate: true})
	t.Cleanup(h.Close)
	if err := h.ProcessTask(context.Background(), task("job", j.ID)); err != nil {
		t.Fatalf("deliver: %v", err)
	}
	got := rcv.deliveries()
	if len(got) != 1 {
		t.Fatalf("%d deliveries", len(got))
	}
	d := got[0]
	secret := secretOf(t, a, tenantID)
	if err := client.VerifyWebhook(secret, d.header.Get("X-Llmq-Signature"), d.body, 5*time.Minute); err != nil {
		t.Fatalf("signature does not verify: %v", err)
	}
	checkReadmeRecipe(t, secret, d)
	if d.header.Get("X-Llmq-Event") != "job.succeeded" || d.header.Get("X-Llmq-Webhook-Id") != "job:"+j.ID ||
		d.header.Get("Content-Type") != "application/json" {
		t.Fatalf("headers = %v", d.header)
	}
	// The body is the job as GET /v1/jobs/{id} shows it.
	var sent, shown map[string]any
	_ = json.Unmarshal(d.body, &sent)
	shown = a.Do("GET", "/v1/jobs/"+j.ID, key, nil).Map(t)
	if sent["id"] != j.ID || sent["status"] != "succeeded" || sent["response"] == nil || len(sent) != len(shown) {
		t.Fatalf("delivered %v, API shows %v", sent, shown)
	}
}

// TestPrivateTargetIsRefused refuses a webhook to a loopback address, by IP
// and by a name that resolves to it, without sending anything, and without
// retrying; redirects to internal addresses are not followed either.
func TestPrivateTargetIsRefused(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Env: allowPrivate})
	_, key := a.Tenant("standard")
	rcv := newReceiver(t, http.StatusOK)
	h := webhook.NewHandler(webhook.Deps{Store: a.Store}, webhook.Options{})
	t.Cleanup(h.Close)
	port := rcv.URL[strings.LastIndex(rcv.URL, ":"):]
	for _, hook := range []string{rcv.URL + "/x", "http://localhost" + port + "/x"} {
		j := finishedJob(t, a, key, hook)
		err := h.ProcessTask(context.Background(), task("job", j.ID))
		var be *webhook.BlockedError
		if !errors.As(err, &be) || !errors.Is(err, asynq.SkipRetry) || !be.Addr.IsLoopback() {
			t.Fatalf("%s: err = %v, want a blocked address that is not retried", hook, err)
		}
	}
	if n := len(rcv.deliveries()); n != 0 {
		t.Fatalf("the private receiver got %d requests", n)
	}
	if refs, _, err := a.Store.WebhookListPending(context.Background(), &store.WebhookListPendingParams{Kind: store.WebhookJob,
		FinishedBefore: time.Now().Add(time.Hour)}); err != nil || len(refs) != 0 {
		t.Fatalf("refused deliveries still pending: %v %v", refs, err)
	}
}

// webhookPending reports whether the store still holds job id's webhook as
// not yet ended.
func webhookPending(t *testing.T, a *apptest.App, id string) bool {
	t.Helper()
	refs, _, err := a.Store.WebhookListPending(context.Background(), &store.WebhookListPendingParams{Kind: store.WebhookJob,
		FinishedBefore: time.Now().Add(time.Hour), Limit: 10000})
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(refs, func(r *store.WebhookRef) bool { return r.ID == id })
}

// TestRetryClassification retries what may pass later (5xx, 408, 429,
// network) and gives up at once on other answers, redirects included.
func TestRetryClassification(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Env: allowPrivate})
	_, key := a.Tenant("standard")
	h := webhook.NewHandler(webhook.Deps{Store: a.Store}, webhook.Options{AllowPrivate: true, Timeout: 2 * time.Second})
	t.Cleanup(h.Close)
	for _, c := range []struct {
		status      int
		ok, retried bool
	}{
		{200, true, false}, {202, true, false},
		{500, false, true}, {503, false, true}, {408, false, true}, {429, false, true},
		{400, false, false}, {404, false, false}, {410, false, false}, {http.StatusFound, false, false},
	} {
		rcv := newReceiver(t, c.status)
		j := finishedJob(t, a, key, rcv.URL)
		err := h.ProcessTask(context.Background(), task("job", j.ID))
		if (err == nil) != c.ok || (err != nil && errors.Is(err, asynq.SkipRetry) == c.retried) {
			t.Errorf("answer %d: err = %v, want ok=%v retried=%v", c.status, err, c.ok, c.retried)
		}
		if n := len(rcv.deliveries()); n != 1 {
			t.Errorf("answer %d: %d requests (a redirect must not be followed)", c.status, n)
		}
		// A delivery that ended is recorded, so the reconciler never sends
		// it again; one to be retried is still pending.
		if p := webhookPending(t, a, j.ID); p != c.retried {
			t.Errorf("answer %d: pending = %v, want %v", c.status, p, c.retried)
		}
	}
	// Nobody listening: a network error, retried.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	j := finishedJob(t, a, key, dead.URL)
	if err := h.ProcessTask(context.Background(), task("job", j.ID)); err == nil || errors.Is(err, asynq.SkipRetry) {
		t.Fatalf("closed port: err = %v, want a retried error", err)
	}
	// A job without a webhook, or not finished, or unknown: nothing to send,
	// or later.
	if err := h.ProcessTask(context.Background(), task("job", "job_01nosuchjob00000000000000")); err != nil {
		t.Fatalf("unknown job: %v", err)
	}
	r := a.Do("POST", "/v1/jobs", key, map[string]any{"webhook_url": "https://example.com/h", "body": apptest.ChatBody("x", "", 5)})
	if err := h.ProcessTask(context.Background(), task("job", r.Map(t)["id"].(string))); err == nil {
		t.Fatal("a queued job's webhook was sent")
	}
}

// TestWorkersDeliverBatchWebhooks runs a batch with a webhook through
// workers (webhooks on their own queue) and receives the batch, signed, once
// it completed.
func TestWorkersDeliverBatchWebhooks(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Workers: 1,
		Env: func(e *config.Env) { e.WebhookAllowPrivate = true }})
	tenantID, key := a.Tenant("standard")
	rcv := newReceiver(t, http.StatusOK)
	in := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}}
{"custom_id":"b","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":5}}
`
	fileID := uploadFile(t, a, key, in)
	r := a.Do("POST", "/v1/batches", key, map[string]any{"input_file_id": fileID, "endpoint": "/v1/chat/completions",
		"completion_window": "24h", "webhook_url": rcv.URL + "/batch"})
	if r.Status != 200 {
		t.Fatalf("create batch: %d %s", r.Status, r.Body)
	}
	id := r.Map(t)["id"].(string)
	// The sweeper runs in the dispatcher; here, in the test, until the
	// workers delivered.
	deadline := time.Now().Add(time.Minute)
	for len(rcv.deliveries()) == 0 {
		if err := a.Batches.Sweep(context.Background()); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no webhook after a minute; batch %s", a.Do("GET", "/v1/batches/"+id, key, nil).Body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	d := rcv.deliveries()[0]
	secret := secretOf(t, a, tenantID)
	if err := client.VerifyWebhook(secret, d.header.Get(client.WebhookSignatureHeader), d.body, time.Minute); err != nil {
		t.Fatal(err)
	}
	checkReadmeRecipe(t, secret, d)
	var b client.Batch
	if err := json.Unmarshal(d.body, &b); err != nil || b.ID != id || b.Status != "completed" ||
		b.RequestCounts != (client.BatchRequestCounts{Total: 2, Completed: 2}) || b.OutputFileID == nil {
		t.Fatalf("delivered batch %+v (%v)", b, err)
	}
	if d.header.Get(client.WebhookEventHeader) != "batch.completed" {
		t.Fatalf("event = %q", d.header.Get(client.WebhookEventHeader))
	}
}

func uploadFile(t *testing.T, a *apptest.App, key, content string) string {
	t.Helper()
	const boundary = "llmqtestboundary"
	body := "--" + boundary + "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" +
		"--" + boundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n" +
		content + "\r\n--" + boundary + "--\r\n"
	r := apptest.Do(t, a.URL, "POST", "/v1/files", key, body, http.Header{"Content-Type": {"multipart/form-data; boundary=" + boundary}})
	if r.Status != 200 {
		t.Fatalf("upload: %d %s", r.Status, r.Body)
	}
	return r.Map(t)["id"].(string)
}

// A webhook URL's path and query may hold the receiver's secret: neither
// the logs (at debug) nor the error asynq keeps as the task's last error
// ever show more than the host, whether the attempt fails to connect or
// times out.
func TestWebhookURLPathIsNeverLogged(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Env: allowPrivate})
	_, key := a.Tenant("standard")
	var logs testutil.SyncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := webhook.NewHandler(webhook.Deps{Store: a.Store, Logger: logger}, webhook.Options{AllowPrivate: true, Timeout: 200 * time.Millisecond})
	t.Cleanup(h.Close)

	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release }))
	t.Cleanup(func() { close(release); hang.Close() })
	const secret = "s3cr3t-path-token"
	for _, base := range []string{dead.URL, hang.URL} {
		j := finishedJob(t, a, key, base+"/hooks/"+secret+"?sig="+secret)
		err := h.ProcessTask(context.Background(), task("job", j.ID))
		if err == nil || errors.Is(err, asynq.SkipRetry) {
			t.Fatalf("%s: err = %v, want a retried error", base, err)
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("the task's error shows the URL's path: %v", err)
		}
	}
	out := logs.String()
	if strings.Contains(out, secret) {
		t.Errorf("the logs show the URL's path:\n%s", out)
	}
	if !strings.Contains(out, `"host":"127.0.0.1"`) || strings.Count(out, "webhook attempt failed") != 2 {
		t.Errorf("want two failed attempts logged with their host:\n%s", out)
	}
}
