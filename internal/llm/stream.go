package llm

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/llmq/llmq/client"
)

const maxEventBytes = 4 << 20

// streamChunk is what llmq reads of a chunk or a Responses API event.
type streamChunk struct {
	Usage *wireUsage          `json:"usage"`
	Error *client.ErrorObject `json:"error"`

	Type     string          `json:"type"`
	Response json.RawMessage `json:"response"`
	Code     json.RawMessage `json:"code"`
	Message  string          `json:"message"`
	Param    string          `json:"param"`
}

// responsesError is the error a Responses API stream ended with, or nil.
func (c *streamChunk) responsesError() *client.ErrorObject {
	switch c.Type {
	case "error":
		o := &client.ErrorObject{Type: "server_error", Param: c.Param,
			Message: cmp.Or(c.Message, "the provider's stream ended with an error")}
		_ = unmarshal(c.Code, &o.Code)
		return o
	case "response.failed":
		o := &client.ErrorObject{Type: "server_error", Message: "the provider's response failed"}
		var r struct {
			Error *client.ErrorObject `json:"error"`
		}
		if unmarshal(c.Response, &r) == nil && r.Error != nil {
			o.Code, o.Message = r.Error.Code, r.Error.Message
		}
		return o
	}
	return nil
}

// fill sets e's provider error fields from o, bounded.
func (p *conn) fill(e *Error, o *client.ErrorObject) {
	e.Message = answerMessage(e.StatusCode, o.Message, true, p.scrub)
	e.Type, e.Code, e.Param = Truncate(o.Type, maxErrorField), client.Code(Truncate(string(o.Code), maxErrorField)), Truncate(o.Param, maxErrorField)
}

func (p *conn) answered(resp *http.Response) *Error {
	return &Error{Provider: p.name, StatusCode: resp.StatusCode, RateLimit: ParseRateLimit(resp.Header),
		RequestID: requestID(resp.Header)}
}

func (p *openAIProvider) errorAnswer(resp *http.Response) *Error {
	e := p.answered(resp)
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var eb struct {
		Error *client.ErrorObject `json:"error"`
	}
	if unmarshal(body, &eb) == nil && eb.Error != nil {
		p.fill(e, eb.Error)
	} else {
		e.Message = answerMessage(resp.StatusCode, "", false, p.scrub)
	}
	classifyAnswer(e)
	return e
}

// stream sends a streaming request over plain HTTP (go-openai's typed chunks
// drop what they do not model) and relays the events to req.Stream.
func (p *openAIProvider) stream(ctx context.Context, req Request, wire []byte) (*Response, error) {
	ctx, cancel := context.WithTimeoutCause(ctx, p.timeout, errTimeout)
	defer cancel()
	path := "/chat/completions"
	switch {
	case req.Endpoint == EndpointResponses:
		path = "/responses"
	case p.azure && p.apiVersion != "":
		path = "/deployments/" + url.PathEscape(req.Upstream) + path
	}
	header := jsonHeader()
	header.Set("Accept", "text/event-stream")
	resp, err := p.send(ctx, http.MethodPost, path, nil, header, bytes.NewReader(wire))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	e := p.answered(resp)
	unended := "the provider's stream ended before [DONE]"
	if req.Endpoint == EndpointResponses {
		unended = "the provider's stream ended before response.completed"
	}
	return p.relay(ctx, req, resp, e, unended, func(data []byte, out *Response) (end, skip bool, err error) {
		if string(data) == "[DONE]" {
			return true, true, nil
		}
		var c streamChunk
		if err := unmarshal(data, &c); err != nil {
			return false, false, e.cut("the provider's stream sent an event that is not JSON", out.Chunks)
		}
		if req.Endpoint == EndpointResponses {
			if o := c.responsesError(); o != nil {
				return false, false, p.streamFailed(e, o, out.Chunks)
			}
			// The events that end the stream with the answer.
			if end = c.Type == "response.completed" || c.Type == "response.incomplete"; end {
				u, err := UsageOf(c.Response)
				if err != nil {
					return false, false, e.cut("the provider's stream ended with a response whose usage cannot be read", out.Chunks)
				}
				out.Body, out.Usage = bytes.Clone(c.Response), u
			}
		} else if c.Error != nil {
			return false, false, p.streamFailed(e, c.Error, out.Chunks)
		}
		if c.Usage != nil && req.Endpoint == EndpointChat {
			if out.Usage, err = UsageOf(data); err != nil {
				return false, false, e.cut("the provider's stream ended with a chunk whose usage cannot be read", out.Chunks)
			}
			out.Body = bytes.Clone(data)
		}
		return end, false, nil
	})
}

// relay reads a streamed answer's server-sent events, bounded, and gives
// each event's data to event, which says whether it ends the stream and
// whether it is kept from req.Stream; the others are relayed as sent. A
// stream that stops before its end fails with unended.
func (p *conn) relay(ctx context.Context, req Request, resp *http.Response, e *Error, unended string,
	event func(data []byte, out *Response) (end, skip bool, err error)) (*Response, error) {
	out := &Response{StatusCode: resp.StatusCode, RequestID: e.RequestID, RateLimit: e.RateLimit}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), maxEventBytes)
	var read int64
	for sc.Scan() {
		line := sc.Bytes()
		if read += int64(len(line)) + 1; read > p.maxResponse {
			e.Relayed = out.Chunks
			return nil, p.tooLarge(e, "stream")
		}
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // comments, event names, blank separators
		}
		data = bytes.TrimSpace(data)
		end, skip, err := event(data, out)
		if err != nil {
			return nil, err
		}
		if !skip {
			if err := req.Stream(data); err != nil {
				return nil, &Error{Class: ClassRetryable, Provider: p.name, StatusCode: resp.StatusCode, Message: "the stream's reader stopped",
					Err: err, Relayed: out.Chunks}
			}
			out.Chunks++
		}
		if end {
			return out, nil
		}
	}
	return nil, p.unended(ctx, sc.Err(), out.Chunks, unended)
}

// unended is a stream that stopped before its end: msg, unless reading it
// failed.
func (p *conn) unended(ctx context.Context, err error, relayed int, msg string) *Error {
	ne := p.noAnswer(ctx, err, relayed)
	ne.Code = client.CodeProviderStreamFailed
	if err == nil {
		ne.Message = msg
	}
	return ne
}

// readAnswer reads a whole answer's body, bounded, and checks it is JSON.
func (p *conn) readAnswer(ctx context.Context, resp *http.Response, e *Error) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.maxResponse+1))
	switch {
	case err != nil:
		return nil, p.noAnswer(ctx, err, 0)
	case int64(len(body)) > p.maxResponse:
		return nil, p.tooLarge(e, "answer")
	case !json.Valid(body):
		return nil, e.serverError(ClassRetryable, client.CodeProviderResponseUnreadable, msgUnreadable)
	}
	return body, nil
}

func (e *Error) cut(msg string, relayed int) *Error {
	e.Class, e.Message, e.Relayed = ClassRetryable, msg, relayed
	return e
}

func (p *conn) streamFailed(e *Error, o *client.ErrorObject, relayed int) *Error {
	p.fill(e, o)
	e.Class, e.Relayed = ClassRetryable, relayed
	e.Code = cmp.Or(e.Code, client.CodeProviderStreamFailed)
	return e
}

// noAnswer is a call that got no whole answer: a timeout, a cancellation or
// a connection error.
func (p *conn) noAnswer(ctx context.Context, err error, relayed int) *Error {
	e := &Error{Class: ClassRetryable, Provider: p.name, Relayed: relayed}
	switch {
	case errors.Is(context.Cause(ctx), errTimeout):
		e.Message = "no answer within " + p.timeout.String()
	case errors.Is(err, context.Canceled):
		e.Message = "the call was cancelled"
	default:
		e.Message = "the provider could not be reached"
	}
	if err != nil {
		e.Err = scrubbedError{err, p.scrub(err.Error())}
	}
	return e
}

// StripUsageChunk reports whether a stream's chunk is the usage chunk that
// include_usage adds, which a client that did not ask for it must not see.
func StripUsageChunk(data []byte) bool {
	if !bytes.Contains(data, []byte(`"usage"`)) {
		return false
	}
	var c struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   json.RawMessage   `json:"usage"`
	}
	return unmarshal(data, &c) == nil && len(c.Choices) == 0 && len(c.Usage) > 0 && !strings.EqualFold(string(c.Usage), "null")
}
