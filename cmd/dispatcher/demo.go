package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/llmq/llmq/client"
)

// demoTopics make the sample prompts differ in length and wording.
var demoTopics = []string{
	"queueing theory", "token buckets", "the history of the telegraph", "rate limits", "budgets",
	"tea", "lighthouses", "sourdough", "tide tables", "paper folding",
}

// runDemo submits n sample jobs and a small batch through the HTTP API, as
// a user would, once the server answers, so the dashboard has work to show.
func runDemo(ctx context.Context, base, key string, n int, logger *slog.Logger) {
	c, err := client.New(base, key)
	if err != nil {
		logger.Error("demo", "err", err)
		return
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := c.Usage(ctx); err == nil {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			logger.Error("demo: the API never answered")
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		topic := demoTopics[i%len(demoTopics)]
		_, err := c.Jobs.Create(ctx, &client.JobCreateParams{
			CustomID: fmt.Sprintf("demo-%d", i+1),
			Body: map[string]any{"model": "gpt-4o-mini", "max_tokens": 50 + 25*(i%8),
				"messages": []map[string]string{{"role": "user", "content": fmt.Sprintf("In %d sentences, tell me about %s.", 1+i%5, topic)}}},
		})
		if err != nil {
			logger.Warn("demo job", "err", err)
		}
	}
	var file bytes.Buffer
	for i := 0; i < 20; i++ {
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("demo-batch-%d", i+1), "method": "POST", "url": "/v1/chat/completions",
			"body": map[string]any{"model": "gpt-4o-mini", "max_tokens": 40,
				"messages": []map[string]string{{"role": "user", "content": "A haiku about " + demoTopics[i%len(demoTopics)] + "."}}}})
		file.Write(append(line, '\n'))
	}
	f, err := c.Files.Upload(ctx, "demo.jsonl", &file, "batch")
	if err != nil {
		logger.Warn("demo batch file", "err", err)
		return
	}
	if _, err := c.Batches.Create(ctx, &client.BatchCreateParams{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}); err != nil {
		logger.Warn("demo batch", "err", err)
	}
}
