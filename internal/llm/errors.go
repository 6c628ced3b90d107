package llm

import (
	"github.com/llmq/llmq/client"

	"net/http"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Class says what a failed call means for the job that made it.
type Class int

const (
	// ClassNone is the zero Class: Classify's answer for a status that is not
	// an error.
	ClassNone Class = iota
	// ClassRateLimited is a 429: the provider's buckets are empty. Every worker
	// should pause until the provider's reset; the attempt is not a failure.
	ClassRateLimited
	// ClassRetryable is a failure that may pass on another try: 5xx, 408, 409,
	// timeouts and connection errors.
	ClassRetryable
	// ClassPermanent is a failure no retry can fix: the other 4xx, a request
	// refused before it was sent, an exhausted account quota.
	ClassPermanent
)

func (c Class) String() string {
	switch c {
	case ClassNone:
		return "none"
	case ClassRateLimited:
		return "rate_limited"
	case ClassRetryable:
		return "retryable"
	case ClassPermanent:
		return "permanent"
	}
	return "Class(" + strconv.Itoa(int(c)) + ")"
}

// Classify maps an HTTP status of a provider's answer to a Class. 408 and 409
// are retryable, as in OpenAI's own clients (409 is a transient conflict on
// OpenAI's side); redirects and other unexpected statuses are permanent, since
// they mean a misconfigured base URL rather than a passing fault.
func Classify(status int) Class {
	switch {
	case status >= 200 && status < 300:
		return ClassNone
	case status == http.StatusTooManyRequests:
		return ClassRateLimited
	case status == http.StatusRequestTimeout, status == http.StatusConflict, status >= 500:
		return ClassRetryable
	default:
		return ClassPermanent
	}
}

// Error is a failed provider call. Its text never holds an API key.
type Error struct {
	Class Class
	// Provider is the provider's name.
	Provider string
	// StatusCode is the provider's HTTP status; 0 when no answer came
	// (timeouts, connection errors) or the request was refused before sending.
	StatusCode int
	// Message, Type, Code and Param are the provider's error object
	// ({"error":{"message","type","code","param"}}), for the job's error.
	Message, Type, Param string
	Code                 client.Code
	// RequestID is the provider's x-request-id, when it answered.
	RequestID string
	// RateLimit is what the error response's headers said; on a 429 its Delay
	// is the provider's retry-after.
	RateLimit RateLimit
	// Err is the underlying error (network, context, decoding), if any.
	Err error
	// Relayed is how many events a stream had relayed when it failed: a
	// stream that relayed any cannot be sent again to the same client.
	Relayed int
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Provider != "" {
		b.WriteString(e.Provider)
		b.WriteString(": ")
	}
	if e.StatusCode != 0 {
		b.WriteString(strconv.Itoa(e.StatusCode))
		b.WriteByte(' ')
	}
	b.WriteString(e.Class.String())
	if e.Code != "" {
		b.WriteString(" (" + string(e.Code) + ")")
	} else if e.Type != "" {
		b.WriteString(" (" + e.Type + ")")
	}
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(redact(e.Message))
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(redact(e.Err.Error()))
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// keyPattern matches strings shaped like provider API keys (OpenAI's and
// Anthropic's sk-...) that a provider might echo back in an error message;
// credentialPattern the user and password of a URL (a database's DSN in a
// traceback).
var (
	keyPattern        = regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{8,}`)
	credentialPattern = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/@]+@`)
)

// redact masks anything shaped like an API key or a URL's credentials. The
// provider also removes its configured key before an Error is built; this
// is the second line.
func redact(s string) string {
	if strings.Contains(s, "sk-") {
		s = keyPattern.ReplaceAllString(s, "sk-[redacted]")
	}
	if strings.Contains(s, "@") {
		s = credentialPattern.ReplaceAllString(s, "${1}[redacted]@")
	}
	return s
}

// maxErrorMessage bounds, in bytes, the provider's message an Error keeps;
// maxErrorField its code, type and param, and a provider's request id.
const (
	maxErrorMessage = 1000
	maxErrorField   = 200
)

// Truncate bounds a provider's string to n bytes, cut at a character's
// boundary and left valid UTF-8 (the store keeps valid UTF-8 only).
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.ToValidUTF8(s[:n], "")
}

// requestID is the provider's x-request-id in h, bounded.
func requestID(h http.Header) string {
	return Truncate(h.Get("x-request-id"), maxErrorField)
}

// answerMessage is what llmq tells of a provider's error answer of status:
// the message of its OpenAI error object, scrubbed and bounded, or, for a
// body that is none (a proxy's HTML page) or a message that is a stack trace
// (a server's internals, a DSN in them), a plain sentence naming the status.
func answerMessage(status int, msg string, isErrorObject bool, scrub func(string) string) string {
	msg = strings.TrimSpace(msg)
	if !isErrorObject || msg == "" || looksLikeTrace(msg) {
		text := http.StatusText(status)
		if text == "" {
			text = "an unexpected status"
		}
		if isErrorObject {
			return "The provider answered " + strconv.Itoa(status) + " " + text + "."
		}
		return "The provider answered " + strconv.Itoa(status) + " " + text + " without an error it explains (not OpenAI's error shape)."
	}
	msg = scrub(msg)
	if len(msg) > maxErrorMessage {
		msg = Truncate(msg, maxErrorMessage) + "…"
	}
	return msg
}

// looksLikeTrace reports whether a message is a stack trace or a server's
// page rather than a sentence for a client.
func looksLikeTrace(msg string) bool {
	if strings.Count(msg, "\n") >= 3 {
		return true
	}
	for _, mark := range []string{"Traceback (most recent call last)", "\tat ", "goroutine ", "<html", "<!DOCTYPE", "Exception in thread"} {
		if strings.Contains(msg, mark) {
			return true
		}
	}
	return false
}
