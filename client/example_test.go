package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"github.com/llmq/llmq/client"
)

// These examples need a running llmq, so they are compiled, not run.

func Example() {
	c, err := client.New("http://127.0.0.1:8080", os.Getenv("LLMQ_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	job, err := c.Jobs.Create(ctx, &client.JobCreateParams{
		CustomID: "greeting",
		Body: map[string]any{
			"model":      "gpt-4o-mini",
			"messages":   []map[string]string{{"role": "user", "content": "Say hi"}},
			"max_tokens": 100,
		},
		// Repeating the call with this key returns the same job.
		IdempotencyKey: "greeting-2026-11-30",
	})
	if err != nil {
		log.Fatal(err)
	}
	job, err = c.Jobs.Wait(ctx, job.ID, nil)
	if err != nil {
		log.Fatal(err)
	}
	if job.Status == "succeeded" {
		fmt.Printf("%s cost $%.6f: %s\n", job.ID, job.CostUSD, job.Response.Body)
	}
}

func ExampleError() {
	c, _ := client.New("http://127.0.0.1:8080", "llmq_wrong")
	_, err := c.Usage(context.Background())
	var apiErr *client.Error
	if errors.As(err, &apiErr) {
		// OpenAI's error object, with the HTTP status and Retry-After.
		fmt.Println(apiErr.StatusCode, apiErr.Type, apiErr.Code, apiErr.RetryAfter)
	}
}

func ExampleJobsService_All() {
	c, _ := client.New("http://127.0.0.1:8080", os.Getenv("LLMQ_API_KEY"))
	// Every failed job, page after page.
	for job, err := range c.Jobs.All(context.Background(), &client.JobListParams{Status: "failed", Limit: 100}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(job.ID, job.Error.Message)
	}
}

func ExampleBatchesService_Wait() {
	c, _ := client.New("http://127.0.0.1:8080", os.Getenv("LLMQ_API_KEY"))
	ctx := context.Background()

	in, err := os.Open("requests.jsonl") // OpenAI batch input lines
	if err != nil {
		log.Fatal(err)
	}
	defer in.Close()
	file, err := c.Files.Upload(ctx, "requests.jsonl", in, "batch") // streamed, not read into memory
	if err != nil {
		log.Fatal(err)
	}
	batch, err := c.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: file.ID, Endpoint: "/v1/chat/completions"})
	if err != nil {
		log.Fatal(err)
	}
	batch, err = c.Batches.Wait(ctx, batch.ID, &client.BatchWaitOptions{
		WaitOptions: client.WaitOptions{Interval: time.Second, MaxInterval: 10 * time.Second},
		OnPoll: func(b *client.Batch) {
			fmt.Printf("%s: %d done, %d failed of %d\n", b.Status, b.RequestCounts.Completed, b.RequestCounts.Failed, b.RequestCounts.Total)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if batch.OutputFileID != nil {
		out, err := c.Files.Content(ctx, *batch.OutputFileID)
		if err != nil {
			log.Fatal(err)
		}
		defer out.Close()
		_, _ = io.Copy(os.Stdout, out)
	}
}

func ExampleAdminService_CreateKey() {
	admin, _ := client.New("http://127.0.0.1:8080", "", client.WithAdminToken(os.Getenv("LLMQ_ADMIN_TOKEN")))
	ctx := context.Background()
	tenant, err := admin.Admin.CreateTenant(ctx, &client.TenantCreateParams{Name: "acme", Tier: "standard"})
	if err != nil {
		log.Fatal(err)
	}
	key, err := admin.Admin.CreateKey(ctx, tenant.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("give acme this key, shown once:", key.Key)
}
