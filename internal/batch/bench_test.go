package batch_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/batch"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
)

// BenchmarkValidateAndEnqueue50k validates a 50,000-line input file (every
// line parsed, custom ids checked, the body judged by admission with its
// tokens counted) and turns it into jobs: bulk-inserted in groups of 5,000
// and every one enqueued in the batch queue. One op is one whole batch, from
// validating to in_progress with all its tasks in Redis; the upload (timed
// once, reported as upload-s) is not part of it.
func BenchmarkValidateAndEnqueue50k(b *testing.B) {
	a := apptest.Start(b, apptest.Options{RedisDB: redisDB, Policy: fastPolicy})
	tenant, key := a.Tenant("standard")
	const n = 50_000
	content := []byte(strings.Join(lines(n), "\n") + "\n")
	began := time.Now()
	fileID := uploadB(b, a, key, content)
	uploadTime := time.Since(began)
	// The service of the benchmark only, so no background pass of the API's
	// runs beside it.
	svc := batch.New(batch.Deps{Store: a.Store, Policy: a.Policy, Queue: a.Queue}, batch.Options{})
	b.Cleanup(func() { _ = svc.Close() })
	ctx := context.Background()
	enqueued := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		bt, err := a.Store.BatchInsert(ctx, &store.BatchInsertParams{TenantID: tenant, InputFileID: fileID,
			Endpoint: "/v1/chat/completions", CompletionWindow: "24h", ExpiresAt: time.Now().Add(24 * time.Hour)})
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := svc.Validate(ctx, bt.ID); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		got, err := a.Store.BatchGetByID(ctx, bt.ID)
		if err != nil || got.Status != store.BatchInProgress || got.Total != n {
			b.Fatalf("batch after validation = %+v, %v", got, err)
		}
		enqueued += n
		stats, err := a.Inspector.QueueStats(ctx)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range stats {
			if s.Name == queue.Batch && s.Size != enqueued {
				b.Fatalf("batch queue holds %d tasks, want %d", s.Size, enqueued)
			}
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "lines/s")
	b.ReportMetric(uploadTime.Seconds(), "upload-s")
}

func uploadB(b *testing.B, a *apptest.App, key string, content []byte) string {
	b.Helper()
	body, h := multipartFile(content)
	r := apptest.Do(b, a.URL, "POST", "/v1/files", key, body, h)
	if r.Status != http.StatusOK {
		b.Fatalf("upload: %d %s", r.Status, r.Body)
	}
	var f struct{ ID string }
	r.JSON(b, &f)
	return f.ID
}
