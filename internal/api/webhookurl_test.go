package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
)

// A webhook URL whose host is an internal address written out, in any form
// a resolver reads, is refused at submit with a 400 naming webhook_url
// (before, it was taken and refused only at delivery); a name is taken and
// checked when the webhook is sent. LLMQ_WEBHOOK_ALLOW_PRIVATE lets them in.
func TestInternalWebhookURLsAreRefusedAtSubmit(t *testing.T) {
	t.Parallel()
	a := start(t)
	tenant, key := a.Tenant("standard")
	job := func(hook string) map[string]any {
		return map[string]any{"webhook_url": hook, "body": apptest.ChatBody("x", "", 5)}
	}
	internal := []string{
		"http://169.254.169.254/latest/meta-data/", "http://10.0.0.7/hook", "https://192.168.1.1:8443/h",
		"http://127.0.0.1:8080/admin", "http://[::1]/h", "http://[::ffff:127.0.0.1]/h", "http://[fe80::1%25eth0]/h",
		"http://2130706433/h", "http://0x7f000001/h", "http://017700000001/h", "http://127.1/h", "http://0/h",
		"http://100.64.0.1/h", "http://localhost:9000/h", "http://api.localhost/h", "http://LOCALHOST./h",
	}
	for _, hook := range internal {
		e := checkError(t, a.Do("POST", "/v1/jobs", key, job(hook)), 400, client.CodeWebhookURLInternal, "webhook_url")
		if strings.Contains(e.Error.Message, "/h") || strings.Contains(e.Error.Message, "admin") {
			t.Errorf("%s: the message repeats the URL's path: %s", hook, e.Error.Message)
		}
	}
	for _, hook := range []string{"http://1.2.3.4.5/h", "http://example.0x10/h", "http://256.1.1.1/h"} {
		checkError(t, a.Do("POST", "/v1/jobs", key, job(hook)), 400, client.CodeInvalidURL, "webhook_url")
	}
	nothingQueued(t, a, tenant)

	for _, hook := range []string{"https://example.com/hooks/llmq?token=abc", "http://93.184.216.34/h", "http://[2606:4700::1111]/h",
		"http://hooks.example.com:8080/x"} {
		if r := a.Do("POST", "/v1/jobs", key, job(hook)); r.Status != http.StatusAccepted {
			t.Errorf("%s: %d %s; want it taken", hook, r.Status, r.Body)
		}
	}

	open := apptest.Start(t, apptest.Options{RedisDB: redisDB, Env: func(e *config.Env) { e.WebhookAllowPrivate = true }})
	_, okKey := open.Tenant("standard")
	for _, hook := range []string{"http://10.0.0.7/hook", "http://localhost:9000/h", "http://2130706433/h"} {
		if r := open.Do("POST", "/v1/jobs", okKey, job(hook)); r.Status != http.StatusAccepted {
			t.Errorf("LLMQ_WEBHOOK_ALLOW_PRIVATE=true, %s: %d %s", hook, r.Status, r.Body)
		}
	}
}
