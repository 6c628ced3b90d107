package store

import (
	"bytes"
	"io"
	"strconv"
	"testing"
)

var benchBackends = []struct {
	name string
	url  func(testing.TB) string
}{{"postgres", postgresURL}, {"sqlite", sqliteURL}}

// batchJobs returns n jobs of one batch, lines 0..n-1.
func batchJobs(tenantID, batchID string, n int) []*JobInsertParams {
	jobs := make([]*JobInsertParams, n)
	for i := range jobs {
		p := jobParams(tenantID)
		p.BatchID, p.LineNo, p.CustomID = batchID, i, "req-"+strconv.Itoa(i)
		jobs[i] = p
	}
	return jobs
}

// BenchmarkJobInsertMany50k inserts a full-size batch (50,000 lines) per op.
func BenchmarkJobInsertMany50k(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.name, func(b *testing.B) {
			db := openURL(b, be.url(b))
			ten := mkTenant(b, db)
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				jobs := batchJobs(ten.ID, mkBatch(b, db, ten.ID).ID, 50_000)
				b.StartTimer()
				if _, err := db.JobInsertMany(b.Context(), &JobInsertManyParams{Jobs: jobs}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(50_000*b.N)/b.Elapsed().Seconds(), "jobs/s")
		})
	}
}

// BenchmarkJobStreamByBatch50k reads a 50,000-line batch back in line order per op.
func BenchmarkJobStreamByBatch50k(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.name, func(b *testing.B) {
			db := openURL(b, be.url(b))
			ten := mkTenant(b, db)
			batch := mkBatch(b, db, ten.ID)
			if _, err := db.JobInsertMany(b.Context(), &JobInsertManyParams{Jobs: batchJobs(ten.ID, batch.ID, 50_000)}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				n := 0
				if err := db.JobStreamByBatch(b.Context(), batch.ID, nil, func(*Job) error { n++; return nil }); err != nil || n != 50_000 {
					b.Fatal(n, err)
				}
			}
		})
	}
}

// BenchmarkJobInsert is the API's path: one job with an idempotency key.
func BenchmarkJobInsert(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.name, func(b *testing.B) {
			db := openURL(b, be.url(b))
			ten := mkTenant(b, db)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p := jobParams(ten.ID)
				p.IdempotencyKey = strconv.Itoa(i)
				if _, created, err := db.JobInsert(b.Context(), p); err != nil || !created {
					b.Fatal(created, err)
				}
			}
		})
	}
}

// BenchmarkJobComplete is the worker's settle step: job update and ledger
// row in one transaction, one fresh job per op.
func BenchmarkJobComplete(b *testing.B) {
	for _, be := range benchBackends {
		b.Run(be.name, func(b *testing.B) {
			db := openURL(b, be.url(b))
			ten := mkTenant(b, db)
			batch := mkBatch(b, db, ten.ID)
			ids, err := db.JobInsertMany(b.Context(), &JobInsertManyParams{Jobs: batchJobs(ten.ID, batch.ID, b.N)})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				res, err := db.JobComplete(b.Context(), &JobCompleteParams{ID: ids[i], Day: "2026-03-01",
					ResponseBody: []byte(`{"id":"chatcmpl-1","choices":[{"message":{"content":"hello"}}]}`),
					PromptTokens: 12, CompletionTokens: 30, Cost: 25})
				if err != nil || !res.Charged {
					b.Fatal(res, err)
				}
			}
		})
	}
}

// BenchmarkFileRoundTrip stores and reads back 32 MiB of JSONL per op
// (uploads reach 200 MB); b.SetBytes makes the result a throughput.
func BenchmarkFileRoundTrip32MiB(b *testing.B) {
	line := []byte(`{"custom_id":"req-1","method":"POST","url":"/v1/chat/completions","body":{"model":"gpt-4o-mini","messages":[{"role":"user","content":"Summarise the following text in one line."}]}}` + "\n")
	content := bytes.Repeat(line, (32<<20)/len(line))
	for _, be := range benchBackends {
		b.Run(be.name, func(b *testing.B) {
			db := openURL(b, be.url(b))
			ten := mkTenant(b, db)
			b.SetBytes(int64(len(content)))
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f, err := db.FileInsert(b.Context(), &FileInsertParams{TenantID: ten.ID, Purpose: FilePurposeBatch,
					Filename: "in.jsonl", Content: bytes.NewReader(content)})
				if err != nil {
					b.Fatal(err)
				}
				rc, err := db.FileOpen(b.Context(), f.ID)
				if err != nil {
					b.Fatal(err)
				}
				if n, err := io.Copy(io.Discard, rc); err != nil || n != int64(len(content)) {
					b.Fatal(n, err)
				}
			}
		})
	}
}
