package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultUserAgent is sent when no WithUserAgent option is given.
const DefaultUserAgent = "llmq-go"

// Client calls one llmq server. It is safe for concurrent use. The services
// group the endpoints: c.Jobs, c.Files, c.Batches, c.Admin; c.Usage reads the
// tenant's spend.
type Client struct {
	base       *url.URL
	apiKey     string
	adminToken string
	hc         *http.Client
	userAgent  string
	retry      RetryPolicy

	// Jobs are single asynchronous completions (/v1/jobs).
	Jobs *JobsService
	// Files are batch input files and the output and error files of
	// batches (/v1/files).
	Files *FilesService
	// Batches are OpenAI-style batches (/v1/batches).
	Batches *BatchesService
	// Admin manages tenants, their keys and the usage report (/admin/v1);
	// it needs WithAdminToken.
	Admin *AdminService
}

// RetryPolicy bounds how the client retries answers of 429 Too Many
// Requests: llmq's per-key API limit answers them with a Retry-After of a
// second or less, so waiting is almost always better than failing.
type RetryPolicy struct {
	// MaxRetries is how many times one call is retried after a 429; 0
	// turns retrying off. Defaults to 3.
	MaxRetries int
	// MaxWait is the longest Retry-After the client waits for; a longer
	// one (an exhausted daily budget says "until midnight") is returned
	// as the *Error at once. Defaults to 30s.
	MaxWait time.Duration
	// Backoff is the first wait when a 429 carries no Retry-After; it
	// doubles on each retry, with jitter, up to 8s. Defaults to 500ms.
	Backoff time.Duration
}

var defaultRetry = RetryPolicy{MaxRetries: 3, MaxWait: 30 * time.Second, Backoff: 500 * time.Millisecond}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends requests through hc instead of a client of its own
// (for proxies, TLS settings or tracing transports). Its Timeout, if any,
// bounds every call, including a long file download; prefer contexts.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithAdminToken sets the admin token that c.Admin sends instead of the API
// key.
func WithAdminToken(token string) Option { return func(c *Client) { c.adminToken = token } }

// WithUserAgent sets the User-Agent header of every request. Defaults to
// DefaultUserAgent.
func WithUserAgent(ua string) Option { return func(c *Client) { c.userAgent = ua } }

// WithRetry replaces the retry policy of 429 answers; zero fields take
// their defaults, except MaxRetries, where 0 turns retrying off.
func WithRetry(p RetryPolicy) Option {
	return func(c *Client) {
		c.retry = RetryPolicy{
			MaxRetries: max(p.MaxRetries, 0),
			MaxWait:    cmp.Or(max(p.MaxWait, 0), defaultRetry.MaxWait),
			Backoff:    cmp.Or(max(p.Backoff, 0), defaultRetry.Backoff),
		}
	}
}

// New returns a client of the llmq server at baseURL (such as
// "http://127.0.0.1:8080"; a trailing "/v1" is accepted, so the base URL of
// an OpenAI SDK works too) that authenticates with apiKey, a tenant key. An
// admin-only client may pass an empty apiKey and WithAdminToken.
func New(baseURL, apiKey string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("llmq: base URL %q is not an absolute http(s) URL", baseURL)
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/v1")
	u.RawQuery, u.Fragment = "", ""
	c := &Client{
		base:      u,
		apiKey:    apiKey,
		hc:        &http.Client{},
		userAgent: DefaultUserAgent,
		retry:     defaultRetry,
	}
	for _, o := range opts {
		o(c)
	}
	c.Jobs = &JobsService{c: c}
	c.Files = &FilesService{c: c}
	c.Batches = &BatchesService{c: c}
	c.Admin = &AdminService{c: c}
	return c, nil
}

// BaseURL returns the server's base URL, without "/v1".
func (c *Client) BaseURL() string { return c.base.String() }

// request is one API call.
type request struct {
	method string
	path   string // with its leading slash, e.g. "/v1/jobs"
	query  url.Values
	admin  bool        // authenticate with the admin token
	json   any         // a JSON body, when not nil
	header http.Header // extra headers
	// body, when set, makes a streamed body (a multipart upload) and its
	// Content-Type. It is called again for a retry; ok false means it
	// cannot be remade and the call is not retried.
	body func() (rd io.ReadCloser, contentType string, ok bool, err error)
}

// call sends req and decodes its 2xx JSON answer into a new T. Any other
// answer is an *Error.
func call[T any](ctx context.Context, c *Client, req *request) (*T, error) {
	resp, err := c.send(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var v T
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return nil, fmt.Errorf("llmq: %s %s: reading the answer: %w", req.method, req.path, err)
	}
	return &v, nil
}

// send sends req and returns a 2xx response, whose body the caller closes.
func (c *Client) send(ctx context.Context, req *request) (*http.Response, error) {
	var payload []byte
	if req.json != nil {
		var err error
		if payload, err = json.Marshal(req.json); err != nil {
			return nil, fmt.Errorf("llmq: %s %s: encoding the request: %w", req.method, req.path, err)
		}
	}
	for attempt := 0; ; attempt++ {
		hreq, retryable, err := c.newRequest(ctx, req, payload)
		if err != nil {
			return nil, err
		}
		resp, err := c.hc.Do(hreq)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("llmq: %s %s: %w", req.method, req.path, err)
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		apiErr := readError(resp)
		if resp.StatusCode != http.StatusTooManyRequests || !retryable || attempt >= c.retry.MaxRetries {
			return nil, apiErr
		}
		wait := cmp.Or(apiErr.RetryAfter, backoff(c.retry.Backoff, attempt))
		if wait > c.retry.MaxWait {
			return nil, apiErr
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// newRequest builds the HTTP request of one attempt; retryable says whether
// its body can be sent again.
func (c *Client) newRequest(ctx context.Context, req *request, payload []byte) (*http.Request, bool, error) {
	u := *c.base
	u.Path += req.path
	u.RawQuery = req.query.Encode()
	var (
		body        io.Reader
		contentType string
		retryable   = true
	)
	switch {
	case req.body != nil:
		rc, ct, ok, err := req.body()
		if err != nil {
			return nil, false, err
		}
		body, contentType, retryable = rc, ct, ok
	case req.json != nil:
		body, contentType = bytes.NewReader(payload), "application/json"
	}
	// A streamed body's own caller closes it (see Upload).
	hreq, err := http.NewRequestWithContext(ctx, req.method, u.String(), body)
	if err != nil {
		return nil, false, fmt.Errorf("llmq: %s %s: %w", req.method, req.path, err)
	}
	maps.Copy(hreq.Header, req.header)
	if contentType != "" {
		hreq.Header.Set("Content-Type", contentType)
	}
	hreq.Header.Set("Accept", "application/json")
	hreq.Header.Set("User-Agent", c.userAgent)
	token := c.apiKey
	if req.admin {
		token = c.adminToken
	}
	if token != "" {
		hreq.Header.Set("Authorization", "Bearer "+token)
	}
	return hreq, retryable, nil
}

// readError reads a non-2xx answer into an *Error. An answer that is not
// OpenAI's error shape (a proxy's HTML page, say) keeps the status and the
// start of its body as the message.
func readError(resp *http.Response) *Error {
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	e := &Error{StatusCode: resp.StatusCode, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	if err := json.Unmarshal(data, e); err != nil || e.Message == "" {
		msg := cmp.Or(strings.TrimSpace(string(data)), http.StatusText(resp.StatusCode))
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		e.ErrorObject = ErrorObject{Message: msg, Type: "http_error"}
	}
	return e
}

// parseRetryAfter reads a Retry-After header: seconds, or an HTTP date.
// Nonsense (negative, unparseable) is treated as absent.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s <= 0 || s > 1e9 {
			return 0
		}
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// backoff is base·2ⁿ capped at 8s, with up to 25% jitter taken off, so
// clients refused together do not come back together.
func backoff(base time.Duration, n int) time.Duration {
	d := base << min(n, 10)
	if d > 8*time.Second || d <= 0 {
		d = 8 * time.Second
	}
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

// sleep waits d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// IsNotFound reports whether err is an API answer of 404 Not Found.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.StatusCode == http.StatusNotFound
}

// pathID escapes an id for a URL path, so no id can change the route.
func pathID(id string) string { return url.PathEscape(id) }
