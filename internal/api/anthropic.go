package api

import (
	"encoding/json"
	"net/http"

	"github.com/llmq/llmq/internal/llm"
)

// messages serves POST /v1/messages, Anthropic's Messages API, so that
// Anthropic's SDKs reach llmq with only their base URL changed: the key
// from x-api-key or a bearer token, errors in Anthropic's shape. A request
// is a job of its tenant as a chat completion is, admitted, limited,
// budgeted and charged alike; a stream relays Anthropic's events as the
// provider sent them.
func (a *syncAPI) messages(w http.ResponseWriter, r *http.Request) error {
	var raw json.RawMessage
	body, err := decodeJSON(w, r, a.Server.opts.MaxBodyBytes, &raw, false)
	if err != nil {
		return err
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(body, &fields) != nil || fields == nil {
		return a.run(w, r, llm.EndpointMessages, body, false, false) // admission names what is wrong
	}
	stream, _, err := streamFields(llm.EndpointMessages, fields)
	if err != nil {
		return err
	}
	return a.run(w, r, llm.EndpointMessages, without(body, fields, "stream"), stream, false)
}
