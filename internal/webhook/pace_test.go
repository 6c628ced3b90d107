package webhook_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/testutil"
	"github.com/llmq/llmq/internal/webhook"
)

// pacedPolicy is apptest's policy with the standard tier's webhooks paced at
// 5 a second per host.
var pacedPolicy = strings.Replace(apptest.PolicyYAML, "    on_exhausted: defer\n    api_rps: 1000\n  - name: premium",
	"    on_exhausted: defer\n    api_rps: 1000\n    webhook_host_rps: 5\n  - name: premium", 1)

// Deliveries of a tenant to one host get slots 200 ms apart (webhook_host_rps
// 5) in the order they first ask; one whose slot is later is put back in
// its queue until then without counting a failure, keeps its slot when it
// comes back early, and goes once its slot is due. Another host is paced
// apart. A delivery that failed takes a new slot behind the others.
func TestWebhooksPacedPerHost(t *testing.T) {
	t.Parallel()
	if !strings.Contains(pacedPolicy, "webhook_host_rps: 5") {
		t.Fatal("the policy edit did not apply")
	}
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: pacedPolicy, Env: allowPrivate})
	_, key := a.Tenant("standard")
	if tr, _ := a.Policy.Current().Tier("standard"); tr.WebhookHostRPS != 5 {
		t.Fatalf("webhook_host_rps = %v", tr.WebhookHostRPS)
	}
	clock := testutil.NewClock(time.Now())
	h := webhook.NewHandler(webhook.Deps{Store: a.Store, Policy: a.Policy,
		Spacer: testutil.Must(limiter.NewSpacer(a.Redis, limiter.Options{Keys: a.Keys, Clock: clock.Now}))},
		webhook.Options{AllowPrivate: true, MaxInlineWait: time.Nanosecond})
	t.Cleanup(h.Close)
	rcvA, rcvB := newReceiver(t, http.StatusOK), newReceiver(t, http.StatusServiceUnavailable)
	portB := rcvB.URL[strings.LastIndex(rcvB.URL, ":"):]
	var toA, toB []*store.Job
	for range 4 {
		toA = append(toA, finishedJob(t, a, key, rcvA.URL+"/hook"))
	}
	for range 2 {
		toB = append(toB, finishedJob(t, a, key, "http://localhost"+portB+"/hook"))
	}
	// process runs a delivery and returns the delay it was put back for; 0
	// when it was attempted.
	process := func(j *store.Job) time.Duration {
		t.Helper()
		err := h.ProcessTask(context.Background(), task("job", j.ID))
		if err == nil || errors.Is(err, asynq.SkipRetry) || !strings.Contains(err.Error(), "slot") {
			return 0
		}
		if queue.IsFailure(err) {
			t.Fatalf("waiting for a slot counts as a failure: %v", err)
		}
		return queue.RetryDelay(0, err, nil)
	}
	for i, j := range toA {
		if d := process(j); d != time.Duration(i)*200*time.Millisecond {
			t.Fatalf("delivery %d to A: put back for %v, want %v", i, d, time.Duration(i)*200*time.Millisecond)
		}
	}
	if d := process(toB[0]); d != 0 {
		t.Fatalf("the first delivery to B waits %v behind A's", d)
	}
	if n := len(rcvA.deliveries()); n != 1 {
		t.Fatalf("A got %d deliveries at once, want 1", n)
	}
	// Back early, each keeps its slot: nothing goes before it.
	clock.Add(300 * time.Millisecond)
	if d := process(toA[3]); d != 300*time.Millisecond {
		t.Fatalf("the fourth back early: put back for %v, want the 300ms left to its slot", d)
	}
	if d := process(toA[1]); d != 0 {
		t.Fatalf("the second at its slot: put back for %v", d)
	}
	clock.Add(300 * time.Millisecond)
	for _, j := range []*store.Job{toA[2], toA[3]} {
		if d := process(j); d != 0 {
			t.Fatalf("a delivery past its slot: put back for %v", d)
		}
	}
	if n := len(rcvA.deliveries()); n != 4 {
		t.Fatalf("A got %d deliveries, want 4", n)
	}
	for i, d := range rcvA.deliveries() {
		if d.header.Get(client.WebhookIDHeader) != "job:"+[]*store.Job{toA[0], toA[1], toA[2], toA[3]}[i].ID {
			t.Fatalf("delivery %d to A is %s: not in the order of the slots", i, d.header.Get(client.WebhookIDHeader))
		}
	}
	// B's first delivery failed (503, retried) and freed its slot; the
	// second, asking now, takes the next free one, and the first's retry
	// the one after it.
	if n := len(rcvB.deliveries()); n != 1 {
		t.Fatalf("B got %d attempts, want 1", n)
	}
	if d := process(toB[1]); d != 0 {
		t.Fatalf("B's second, 600ms on: put back for %v", d)
	}
	if d := process(toB[0]); d != 200*time.Millisecond {
		t.Fatalf("B's failed delivery again: put back for %v, want a new slot 200ms after the second", d)
	}
}

// With real workers, deliveries past the first second at a host are put
// back in their queue and still all go out, each once.
func TestWorkersDeliverPacedWebhooks(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Workers: 1, Policy: pacedPolicy,
		Env: func(e *config.Env) { e.WebhookAllowPrivate = true }})
	_, key := a.Tenant("standard")
	rcv := newReceiver(t, http.StatusOK)
	const n = 8 // at 5 a second, the last two wait more than a second
	for range n {
		if r := a.Do("POST", "/v1/jobs", key, map[string]any{"webhook_url": rcv.URL, "body": apptest.ChatBody("hi", "", 5)}); r.Status != 202 {
			t.Fatalf("create job: %d %s", r.Status, r.Body)
		}
	}
	testutil.Eventually(t, time.Minute, func() bool { return len(rcv.deliveries()) >= n })
	seen := map[string]bool{}
	for _, d := range rcv.deliveries() {
		id := d.header.Get(client.WebhookIDHeader)
		if seen[id] {
			t.Fatalf("%s delivered twice", id)
		}
		seen[id] = true
	}
}
