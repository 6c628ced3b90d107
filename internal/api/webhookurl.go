package api

import (
	"net/url"
	"strconv"
	"strings"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/netguard"
	"github.com/llmq/llmq/internal/wire"
)

// validateWebhookURL refuses, naming webhook_url, a URL llmq could never
// deliver to: not absolute http(s), too long, with credentials or a port
// outside 1-65535, or whose host is an internal address written out
// (netguard.Literal: 10.0.0.5, [::1], 2130706433) or localhost, unless LLMQ_WEBHOOK_ALLOW_PRIVATE. A
// name is only resolved when the webhook is sent, and every address it
// resolves to is checked then.
func (s *Server) validateWebhookURL(raw string) error {
	if raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || len(raw) > 2048 {
		return wire.Invalid("webhook_url", client.CodeInvalidURL, "webhook_url must be an absolute http(s) URL of at most 2048 characters.")
	}
	if u.User != nil {
		return wire.Invalid("webhook_url", client.CodeInvalidURL, "webhook_url must not carry credentials.")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return wire.Invalid("webhook_url", client.CodeInvalidURL, "webhook_url's port must be within 1 and 65535, got '%.10s'.", p)
		}
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if a, ok := netguard.Literal(host); ok {
		if netguard.Blocked(a) && !s.opts.WebhookAllowPrivate {
			return wire.Invalid("webhook_url", client.CodeWebhookURLInternal,
				"webhook_url's host %s is a loopback, private, link-local or otherwise internal address; webhooks go to public addresses only.", a)
		}
		return nil
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		if !s.opts.WebhookAllowPrivate {
			return wire.Invalid("webhook_url", client.CodeWebhookURLInternal,
				"webhook_url's host %s is this machine; webhooks go to public addresses only.", host)
		}
		return nil
	}
	// A name whose last label is a number is no DNS name, and no
	// address either (1.2.3.4.5, 0x7g): a resolver might read it as one.
	labels := strings.Split(host, ".")
	if last := labels[len(labels)-1]; last == "" || strings.Trim(last, "0123456789") == "" || strings.HasPrefix(last, "0x") {
		return wire.Invalid("webhook_url", client.CodeInvalidURL, "webhook_url's host '%.100s' is neither a DNS name nor an IP address.", host)
	}
	return nil
}
