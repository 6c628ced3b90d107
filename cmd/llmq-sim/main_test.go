package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/llmq/llmq/internal/cmdline"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRunServesUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-rpm", "1", "-tpm", "10000", "-itpm", "5000", "-otpm", "1000", "-seed", "3", "-embedding-dim", "4", "-log-level", "warn"}, pw)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+`).FindString(line)
	if url == "" {
		t.Fatalf("no URL in %q", line)
	}

	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer client.CloseIdleConnections()
	post := func(path, body string) *http.Response {
		t.Helper()
		resp, err := client.Post(url+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	chat := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`
	if resp := post("/v1/chat/completions", chat); resp.StatusCode != 200 {
		t.Errorf("first: %d", resp.StatusCode)
	}
	if resp := post("/v1/chat/completions", chat); resp.StatusCode != 429 || resp.Header.Get("retry-after") != "60" {
		t.Errorf("second (rpm 1): %d retry-after %q", resp.StatusCode, resp.Header.Get("retry-after"))
	}
	resp := post("/v1/embeddings", `{"model":"e","input":"hi"}`)
	var emb struct {
		Data []struct{ Embedding []float64 }
	}
	if err := json.NewDecoder(resp.Body).Decode(&emb); err != nil || len(emb.Data) != 1 || len(emb.Data[0].Embedding) != 4 {
		t.Errorf("embeddings: %v %+v", err, emb)
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", strings.NewReader(`{"model":"claude","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("x-api-key", "k")
	req.Header.Set("anthropic-version", "2023-06-01")
	anth, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	anth.Body.Close()
	if anth.StatusCode != 200 || anth.Header.Get("anthropic-ratelimit-input-tokens-limit") != "5000" ||
		anth.Header.Get("anthropic-ratelimit-output-tokens-limit") != "1000" || anth.Header.Get("anthropic-ratelimit-requests-remaining") != "0" {
		t.Errorf("messages: %d %v", anth.StatusCode, anth.Header)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

// serve runs the simulator with args on a free port until the test ends,
// and returns its URL and a client.
func serve(t *testing.T, args ...string) (string, *http.Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"-addr", "127.0.0.1:0", "-log-level", "warn"}, args...), pw)
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	client := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return regexp.MustCompile(`http://127\.0\.0\.1:\d+`).FindString(line), client
}

// The provider modes are flags: a refund, another tokenizer, another
// application on the account, and which headers are sent.
func TestRunModeFlags(t *testing.T) {
	t.Parallel()
	url, client := serve(t, "-tpm", "60000", "-refund", "-prompt-factor", "2", "-external-tpm", "6000", "-rate-headers", "limits")
	resp, err := client.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello world"}],"max_tokens":100}`))
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Usage struct {
			PromptTokens     int64 `json:"prompt_tokens"`
			CompletionTokens int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || out.Usage.PromptTokens != 4 { // "hello world" is 2 tokens, counted twice
		t.Errorf("usage %+v %v: -prompt-factor 2 not applied", out.Usage, err)
	}
	if resp.Header.Get("x-ratelimit-limit-tokens") != "60000" || resp.Header.Get("x-ratelimit-remaining-tokens") != "" {
		t.Errorf("-rate-headers limits: headers %v", resp.Header)
	}
	resp, err = client.Get(url + "/sim/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		TokensAdmitted int64 `json:"tokens_admitted"`
		TokensRefunded int64 `json:"tokens_refunded"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.TokensAdmitted != 104 || st.TokensRefunded != 100-out.Usage.CompletionTokens {
		t.Errorf("stats %+v %v: -refund not applied", st, err)
	}
}

// Worst-case billing, the result of a tool call, random ids and a key for
// every path are flags: a call without max_tokens produces the default
// output whole, a web search tool is called 10 times, and the bill log needs
// the key.
func TestRunWorstCaseFlags(t *testing.T) {
	t.Parallel()
	url, client := serve(t, "-worst-case", "-default-max-tokens", "300", "-tool-result-tokens", "50", "-random-ids", "-api-key", "sk-flags")
	call := func(method, path, key, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	var out struct {
		ID    string `json:"id"`
		Usage struct {
			InputTokens  int64 `json:"input_tokens"`
			OutputTokens int64 `json:"output_tokens"`
		} `json:"usage"`
	}
	code, body := call("POST", "/v1/responses", "sk-flags", `{"model":"m","input":"hello world","tools":[{"type":"web_search"}]}`)
	if err := json.Unmarshal(body, &out); code != 200 || err != nil {
		t.Fatalf("%d %s", code, body)
	}
	// 11 turns of the 2-token prompt, 55 results of 50 tokens, 10 re-readings of the 300 output tokens.
	if out.Usage.OutputTokens != 300 || out.Usage.InputTokens != 11*2+50*55+10*300 || !regexp.MustCompile(`^resp_[0-9a-f]{24}$`).MatchString(out.ID) {
		t.Errorf("answer %s: -worst-case, -tool-result-tokens or -random-ids not applied", body)
	}
	if code, _ := call("GET", "/sim/bills", "", ""); code != http.StatusUnauthorized {
		t.Errorf("/sim/bills without the key: %d", code)
	}
	code, body = call("GET", "/sim/bills", "sk-flags", "")
	var bills []struct {
		InputTokens int64            `json:"input_tokens"`
		ToolCalls   map[string]int64 `json:"tool_calls"`
	}
	if err := json.Unmarshal(body, &bills); code != 200 || err != nil || len(bills) != 1 || bills[0].InputTokens != out.Usage.InputTokens ||
		bills[0].ToolCalls["web_search"] != 10 {
		t.Errorf("bills: %d %s", code, body)
	}
}

// A short window, Azure's headers and a wait in seconds are flags too.
func TestRunWindowFlags(t *testing.T) {
	t.Parallel()
	url, client := serve(t, "-rpm", "600", "-window", "10s", "-window-kind", "fixed", "-rate-headers", "azure", "-retry-after", "seconds")
	var last *http.Response
	for range 201 { // 100 a fixed window of 10 s at 600 RPM; an edge may fall among them
		resp, err := client.Post(url+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1}`))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		last = resp
		if resp.StatusCode == http.StatusTooManyRequests {
			break
		}
	}
	h := last.Header
	if last.StatusCode != http.StatusTooManyRequests || h.Get("retry-after") == "" || h.Get("retry-after-ms") != "" ||
		h.Get("x-ratelimit-remaining-requests") == "" || h.Get("x-ratelimit-limit-requests") != "" {
		t.Errorf("past 100 requests in a window of 10 s: %d %v", last.StatusCode, h)
	}
}

// The batch settings are flags: here a queue limit that refuses any batch,
// with no time spent validating.
func TestRunBatchFlags(t *testing.T) {
	t.Parallel()
	url, client := serve(t, "-batch-queue-limit", "1", "-batch-validating-for", "-1ns", "-batch-lines-per-second", "-1")
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write([]byte(`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hello world"}]}}` + "\n"))
	_ = mw.Close()
	var obj struct {
		ID     string `json:"id"`
		Status string `json:"status"`
		Errors *struct {
			Data []struct{ Code string } `json:"data"`
		} `json:"errors"`
	}
	call := func(resp *http.Response, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(&obj); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%d %v", resp.StatusCode, err)
		}
	}
	call(client.Post(url+"/v1/files", mw.FormDataContentType(), &form))
	call(client.Post(url+"/v1/batches", "application/json",
		strings.NewReader(`{"input_file_id":"`+obj.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`)))
	call(client.Get(url + "/v1/batches/" + obj.ID))
	if obj.Status != "failed" || obj.Errors == nil || len(obj.Errors.Data) != 1 || obj.Errors.Data[0].Code != "token_limit_exceeded" {
		t.Errorf("batch over -batch-queue-limit 1: %+v", obj)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-rate-429", "2"},
		{"-rpm", "-5"},
		{"-headers-at", "later"},
		{"-rate-headers", "some"},
		{"-header-noise", "2"},
		{"-retry-after", "soon"},
		{"-window", "-1s"},
		{"-window", "1s", "-window-kind", "round"},
		{"-ramp", "-1"},
		{"-prompt-factor", "-1"},
		{"-tool-result-tokens", "-1"},
		{"-batch-expire-fraction", "2"},
		{"-batch-fail-rate", "-0.5"},
		{"-batch-queue-limit", "-1"},
		{"-batch-max-lines", "-1"},
		{"-log-level", "loud"},
		{"-addr", "not an address"},
		{"-nope"},
		{"extra"},
	} {
		var out strings.Builder
		if err := run(context.Background(), args, &out); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	// A flag that does not exist, or an argument, is bad usage: exit 2.
	for _, args := range [][]string{{"-nope"}, {"extra"}, {"-log-level", "loud"}} {
		if err := run(context.Background(), args, io.Discard); cmdline.ExitCode(err) != cmdline.ExitUsage {
			t.Errorf("%v: %v exits %d, want %d", args, err, cmdline.ExitCode(err), cmdline.ExitUsage)
		}
	}
	for _, h := range []string{"-h", "--help", "help"} {
		var out strings.Builder
		if err := run(context.Background(), []string{h}, &out); err != nil || !strings.HasPrefix(out.String(), "usage: llmq-sim") || !strings.Contains(out.String(), "-tpm") ||
			!strings.Contains(out.String(), "/v1/messages") || !strings.Contains(out.String(), "-itpm") || !strings.Contains(out.String(), "-rate-529") {
			t.Errorf("%s: %v %q", h, err, out.String())
		}
	}
	var out strings.Builder
	if err := run(context.Background(), []string{"--version"}, &out); err != nil || !strings.HasPrefix(out.String(), "llmq-sim ") {
		t.Errorf("--version: %v %q", err, out.String())
	}
}
