package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// streamRequest reads a chat or Responses API body's stream and
// stream_options, as OpenAI does, and returns the body without them: the
// exchange admits a stream exactly as the same request unstreamed, in every
// counting mode.
func streamRequest(endpoint string, body []byte) (rest []byte, stream, includeUsage bool, err error) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil {
		return body, false, false, nil // Begin refuses it
	}
	raw, ok := fields["stream"]
	if !ok || string(raw) == "null" || string(raw) == "false" {
		if so, ok := fields["stream_options"]; ok && string(so) != "null" {
			return nil, false, false, errors.New("The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		}
		return body, false, false, nil
	}
	if string(raw) != "true" {
		return nil, false, false, errors.New("'stream' must be a boolean")
	}
	if endpoint != llm.EndpointChat && endpoint != llm.EndpointResponses {
		return nil, false, false, errors.New("'stream' is not supported on " + endpoint)
	}
	if so, ok := fields["stream_options"]; ok && string(so) != "null" && endpoint == llm.EndpointChat {
		var o struct {
			IncludeUsage *bool `json:"include_usage"`
		}
		if err := json.Unmarshal(so, &o); err != nil {
			return nil, false, false, errors.New("'stream_options' must be an object with a boolean include_usage")
		}
		includeUsage = o.IncludeUsage != nil && *o.IncludeUsage
	}
	delete(fields, "stream")
	delete(fields, "stream_options")
	rest, _ = json.Marshal(fields)
	return rest, true, includeUsage, nil
}

// chunkedCompletion is the part of a chat completion a stream is cut from.
type chunkedCompletion struct {
	ID                string          `json:"id"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	ServiceTier       string          `json:"service_tier"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Usage             json.RawMessage `json:"usage"`
	Choices           []struct {
		Index   int `json:"index"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
}

// streamParts is how many content chunks each choice is sent in, at most.
const streamParts = 8

// events is an answer cut into Server-Sent Events, each whole (its data
// line and the blank line after it): head goes with the headers, parts[k]
// after the k-th of streamParts shares of the time its tokens take, tail
// once the exchange finished. failed ends a stream that fails after its
// first part instead (Faults.StreamError).
type events struct {
	head   [][]byte
	parts  [streamParts][][]byte
	tail   [][]byte
	failed []byte
}

// streamErrorMessage is what a stream that fails midway says, as OpenAI's
// server errors do.
const streamErrorMessage = "The server had an error while processing your request. Sorry about that!"

// chatEvents cuts a chat completion into OpenAI's chunks: the role of each
// choice, its content in up to streamParts chunks, the finish reasons, the
// usage chunk when asked, then [DONE].
func chatEvents(body []byte, includeUsage bool) (*events, error) {
	var c chunkedCompletion
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, err
	}
	usageField := ""
	if includeUsage {
		usageField = `,"usage":null`
	}
	chunk := func(choices string, extra string) []byte {
		var b bytes.Buffer
		fmt.Fprintf(&b, `data: {"id":%q,"object":"chat.completion.chunk","created":%d,"model":%q,"service_tier":%q,"system_fingerprint":%q,"choices":[%s]%s}`+"\n\n",
			c.ID, c.Created, c.Model, c.ServiceTier, c.SystemFingerprint, choices, extra)
		return b.Bytes()
	}
	choice := func(i int, delta, finish string) string {
		return fmt.Sprintf(`{"index":%d,"delta":%s,"logprobs":null,"finish_reason":%s}`, i, delta, finish)
	}
	ev := &events{}
	for _, ch := range c.Choices {
		ev.head = append(ev.head, chunk(choice(ch.Index, `{"role":"assistant","content":"","refusal":null}`, "null"), usageField))
	}
	for _, ch := range c.Choices {
		for k, part := range split(ch.Message.Content, streamParts) {
			text, _ := json.Marshal(part)
			ev.parts[k] = append(ev.parts[k], chunk(choice(ch.Index, `{"content":`+string(text)+`}`, "null"), usageField))
		}
	}
	for _, ch := range c.Choices {
		finish, _ := json.Marshal(ch.FinishReason)
		ev.tail = append(ev.tail, chunk(choice(ch.Index, `{}`, string(finish)), usageField))
	}
	if includeUsage && len(c.Usage) > 0 {
		ev.tail = append(ev.tail, chunk("", `,"usage":`+string(bytes.TrimSpace(c.Usage))))
	}
	ev.tail = append(ev.tail, []byte("data: [DONE]\n\n"))
	ev.failed = []byte(`data: {"error":{"message":"` + streamErrorMessage + `","type":"server_error","param":null,"code":null}}` + "\n\n")
	return ev, nil
}

// serveStream answers an admitted exchange as Server-Sent Events, as OpenAI
// streams a chat completion (chatEvents) or a response (responsesEvents):
// the first events after the call's base latency, the content in up to
// streamParts events over the time its tokens take, then the end. The
// exchange finishes (its refund) when the last content is sent. The headers
// go with the first event, so under HeadersAtCompletion a stream's counts
// are those of its start: they lack its own refund, never more.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request, x *Exchange, includeUsage bool) {
	var ev *events
	var err error
	switch x.endpoint {
	case EndpointMessages:
		ev, err = messageEvents(x.body)
	case llm.EndpointResponses:
		ev, err = responsesEvents(x.body, s.draw(x.n, drawNoise+4) < 0.5)
	default:
		ev, err = chatEvents(x.body, includeUsage)
	}
	if err != nil {
		x.Finish()
		apiError(w, http.StatusInternalServerError, "The simulator could not cut its answer into chunks.", "server_error", "", "")
		return
	}
	perToken := time.Duration(x.completion) * s.cfg.LatencyPerToken
	if !s.wait(r, x.latency-perToken) {
		x.Finish()
		return
	}
	for k, v := range x.header {
		w.Header()[k] = v
	}
	w.Header().Del("Content-Length")
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	send := func(events [][]byte) bool {
		for _, e := range events {
			if _, err := w.Write(e); err != nil {
				return false
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		return true
	}
	if !send(ev.head) {
		x.Finish()
		return
	}
	fails := s.streamFails(x.n)
	for k := range streamParts {
		if !s.wait(r, perToken/streamParts) || !send(ev.parts[k]) {
			x.Finish()
			return
		}
		if fails {
			x.Finish()
			send([][]byte{ev.failed})
			return
		}
	}
	x.Finish()
	send(ev.tail)
}

// split cuts text at spaces into at most n parts that join back into it.
func split(text string, n int) []string {
	words := strings.SplitAfter(text, " ")
	per := (len(words) + n - 1) / n
	var out []string
	for len(words) > 0 {
		k := min(per, len(words))
		out = append(out, strings.Join(words[:k], ""))
		words = words[k:]
	}
	return out
}
