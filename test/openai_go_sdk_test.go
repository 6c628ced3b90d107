package integration

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmq/llmq/internal/apptest"
)

// TestOpenAIGoSDKSync drives llmq's synchronous endpoints with the official
// Go SDK (openai-go), changing nothing but its base URL: chat whole and
// streamed, embeddings, models.list, and a refusal as the SDK's error.
func TestOpenAIGoSDKSync(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	_, key := a.Tenant("standard")
	c := openai.NewClient(option.WithBaseURL(a.URL+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	params := openai.ChatCompletionNewParams{
		Model:     "gpt-4o-mini",
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello.")},
		MaxTokens: openai.Int(30),
	}

	var raw *http.Response
	cc, err := c.Chat.Completions.New(ctx, params, option.WithResponseInto(&raw))
	if err != nil {
		t.Fatal(err)
	}
	if len(cc.Choices) != 1 || cc.Choices[0].Message.Content == "" || cc.Usage.TotalTokens == 0 {
		t.Fatalf("chat %+v", cc)
	}
	if !strings.HasPrefix(raw.Header.Get("X-Llmq-Job-Id"), "job_") {
		t.Fatalf("headers %v", raw.Header)
	}

	for _, withUsage := range []bool{false, true} {
		p := params
		if withUsage {
			p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		}
		s := c.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		chunks := 0
		for s.Next() {
			acc.AddChunk(s.Current())
			chunks++
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		if chunks < 3 || acc.Choices[0].Message.Content == "" || (acc.Usage.TotalTokens > 0) != withUsage {
			t.Fatalf("include_usage %v: %d chunks, %+v", withUsage, chunks, acc.ChatCompletion)
		}
	}

	e, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "text-embedding-3-small",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"one", "two"}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Data) != 2 || len(e.Data[0].Embedding) == 0 || e.Usage.PromptTokens == 0 {
		t.Fatalf("embeddings %+v", e.Usage)
	}

	var ids []string
	it := c.Models.ListAutoPaging(ctx)
	for it.Next() {
		ids = append(ids, it.Current().ID)
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ids, "gpt-4o-mini") || !slices.Contains(ids, "text-embedding-3-small") {
		t.Fatalf("models %v", ids)
	}

	bad := params
	bad.Model = "no-such-model"
	_, err = c.Chat.Completions.New(ctx, bad)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "model" {
		t.Fatalf("bad model: %v", err)
	}
}

// TestOpenAINodeSDKSync runs test/node/sync.mjs, the official OpenAI Node
// SDK against llmq's synchronous endpoints.
func TestOpenAINodeSDKSync(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB})
	_, key := a.Tenant("standard")
	t.Logf("%s", runNodeScript(t, 3*time.Minute, "sync.mjs", a.URL+"/v1", key))
}
