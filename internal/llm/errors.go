package llm

import (
	"cmp"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/llmq/llmq/client"
)

// Class says what a failed call means for the job that made it.
type Class int

const (
	ClassNone Class = iota // a status that is not an error
	// ClassRateLimited is a 429: every worker pauses until the provider's
	// reset; the attempt is not a failure.
	ClassRateLimited
	ClassRetryable // 5xx, 408, 409, timeouts and connection errors
	// ClassPermanent no retry can fix: the other 4xx, a request refused
	// before it was sent, an exhausted account quota.
	ClassPermanent
)

var classNames = [...]string{ClassNone: "none", ClassRateLimited: "rate_limited", ClassRetryable: "retryable", ClassPermanent: "permanent"}

func (c Class) String() string {
	if c >= 0 && int(c) < len(classNames) {
		return classNames[c]
	}
	return "Class(" + strconv.Itoa(int(c)) + ")"
}

// Classify maps an HTTP status of a provider's answer to a Class. 408 and 409
// are retryable, as in OpenAI's own clients; redirects and other unexpected
// statuses are permanent: a misconfigured base URL, not a passing fault.
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
	Class    Class
	Provider string
	// StatusCode is the provider's HTTP status; 0 when no answer came or
	// the request was refused before sending.
	StatusCode           int
	Message, Type, Param string // the provider's error object, with Code
	Code                 client.Code
	RequestID            string // the provider's x-request-id (Anthropic's request-id)
	RateLimit            RateLimit
	Err                  error // the underlying error (network, context, decoding)
	// Relayed is how many events a stream had relayed when it failed: a
	// stream that relayed any cannot be sent again to the same client.
	Relayed int
}

func (e *Error) Error() string {
	s := e.Class.String()
	if e.StatusCode != 0 {
		s = strconv.Itoa(e.StatusCode) + " " + s
	}
	if e.Provider != "" {
		s = e.Provider + ": " + s
	}
	if code := cmp.Or(string(e.Code), e.Type); code != "" {
		s += " (" + code + ")"
	}
	if e.Message != "" {
		s += ": " + redact(e.Message)
	}
	if e.Err != nil {
		s += ": " + redact(e.Err.Error())
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

func (e *Error) serverError(class Class, code client.Code, msg string) *Error {
	e.Class, e.Code, e.Type, e.Message = class, code, "server_error", msg
	return e
}

// keyPattern matches provider API keys (sk-...) a provider might echo back;
// credentialPattern the user and password of a URL (a DSN in a traceback).
var (
	keyPattern        = regexp.MustCompile(`\bsk-[A-Za-z0-9_\-]{8,}`)
	credentialPattern = regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/@]+@`)
)

// redact masks anything shaped like an API key or a URL's credentials, the
// second line after the provider's scrub of its own key.
func redact(s string) string {
	if strings.Contains(s, "sk-") {
		s = keyPattern.ReplaceAllString(s, "sk-[redacted]")
	}
	if strings.Contains(s, "@") {
		s = credentialPattern.ReplaceAllString(s, "${1}[redacted]@")
	}
	return s
}

// The bytes an Error keeps of the provider's message, and of its code, type,
// param and request id.
const (
	maxErrorMessage = 1000
	maxErrorField   = 200
)

// Truncate bounds a provider's string to n bytes, cut at a character's
// boundary and left valid UTF-8.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return strings.ToValidUTF8(s[:n], "")
}

// requestID is the provider's id of a call: OpenAI's x-request-id,
// Anthropic's request-id.
func requestID(h http.Header) string {
	return Truncate(cmp.Or(h.Get("x-request-id"), h.Get("request-id")), maxErrorField)
}

// answerMessage is what llmq tells of a provider's error answer of status:
// its error object's message, scrubbed and bounded, or a sentence naming the
// status for a body that is none (a proxy's page) or a stack trace.
func answerMessage(status int, msg string, isErrorObject bool, scrub func(string) string) string {
	msg = strings.TrimSpace(msg)
	if !isErrorObject || msg == "" || looksLikeTrace(msg) {
		answered := "The provider answered " + strconv.Itoa(status) + " " + cmp.Or(http.StatusText(status), "an unexpected status")
		if isErrorObject {
			return answered + "."
		}
		return answered + " without an error it explains (not OpenAI's error shape)."
	}
	msg = scrub(msg)
	if len(msg) > maxErrorMessage {
		msg = Truncate(msg, maxErrorMessage) + "…"
	}
	return msg
}

var traceMarks = []string{"Traceback (most recent call last)", "\tat ", "goroutine ", "<html", "<!DOCTYPE", "Exception in thread"}

func looksLikeTrace(msg string) bool {
	return strings.Count(msg, "\n") >= 3 || slices.ContainsFunc(traceMarks, func(mark string) bool { return strings.Contains(msg, mark) })
}
