package sim

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"regexp"
	"slices"
	"strconv"

	"github.com/llmq/llmq/internal/llm"
)

// members is a request body's members by their exact names. What decides a
// call's bill is read from it case-sensitively, as OpenAI reads it, and not
// through llmq's parser: the simulator is the reader llmq's estimate is
// checked against, so a body whose only limit is "MAX_TOKENS" is, here as at
// OpenAI, a request with no output limit, whatever llmq made of it.
type members map[string]json.RawMessage

// readMembers decodes body's members; nil for a body that is not a JSON
// object (llmq's parser refuses it first).
func readMembers(body []byte) members {
	var m members
	if json.Unmarshal(body, &m) != nil {
		return nil
	}
	return m
}

// terms are what decides a chat or Responses API call's bill, read from its
// members.
type terms struct {
	// maxTokens is the output limit of each choice; 0 when the request names
	// none (the model's default applies).
	maxTokens int64
	// n is the number of choices; 1 but for a chat request's n.
	n int64
	// tier is the service tier the call is served in: the one asked for,
	// "default" for "auto" or none.
	tier string
	// builtins are the kinds of the built-in tools the request offers
	// ("web_search", "file_search", "code_interpreter", "image_generation"),
	// in its order; calls is how many calls to them a worst-case answer
	// makes: max_tool_calls, else defaultToolCalls; one for a chat request
	// with web_search_options.
	builtins []string
	calls    int64
	// previous is the previous_response_id; refs the ids of the input's
	// item_reference items.
	previous string
	refs     []string
}

// The service tiers OpenAI serves; "auto" is served as "default".
var serviceTiers = []string{"auto", "default", "flex", "scale", "priority"}

// defaultToolCalls is how many built-in tool calls a worst-case answer
// makes when the request sets no max_tool_calls.
const defaultToolCalls = 10

// maxToolCalls bounds max_tool_calls: the simulator writes every call as an
// output item, and OpenAI documents no bound of its own.
const maxToolCalls = 1000

// minOutputTokens is the least max_output_tokens the Responses API takes.
const minOutputTokens = 16

// readTerms reads the terms of a request to endpoint (chat completions or
// the Responses API) from its members, refusing, in OpenAI's words, values
// of the wrong type or out of range.
func readTerms(endpoint string, m members) (terms, *refusal) {
	t := terms{n: 1, tier: "default"}
	tier, bad := m.str("service_tier")
	switch {
	case bad != nil:
		return t, bad
	case tier != "" && !slices.Contains(serviceTiers, tier):
		return t, &refusal{http.StatusBadRequest, "Invalid value: '" + tier + "'. Supported values are: 'auto', 'default', 'flex', 'scale', and 'priority'.",
			"invalid_request_error", "service_tier", "invalid_value"}
	case tier != "" && tier != "auto":
		t.tier = tier
	}
	if endpoint == llm.EndpointChat {
		mt, _, bad := m.integer("max_tokens", 1, math.MaxInt32)
		if bad != nil {
			return t, bad
		}
		mct, _, bad := m.integer("max_completion_tokens", 1, math.MaxInt32)
		if bad != nil {
			return t, bad
		}
		t.maxTokens = max(mt, mct)
		if n, ok, bad := m.integer("n", 1, 128); bad != nil {
			return t, bad
		} else if ok {
			t.n = n
		}
		if jsonKind(m["web_search_options"]) != 0 {
			t.builtins, t.calls = []string{ToolWebSearch}, 1
		}
		return t, nil
	}

	mot, _, bad := m.integer("max_output_tokens", minOutputTokens, math.MaxInt32)
	if bad != nil {
		return t, bad
	}
	t.maxTokens = mot
	if t.previous, bad = m.str("previous_response_id"); bad != nil {
		return t, bad
	}
	var tools []members
	if jsonKind(m["tools"]) == kindArray {
		_ = json.Unmarshal(m["tools"], &tools)
	}
	for _, tool := range tools {
		typ, _ := tool.str("type")
		if kind := builtinKind(typ); kind != "" {
			t.builtins = append(t.builtins, kind)
		}
	}
	calls, named, bad := m.integer("max_tool_calls", 0, maxToolCalls)
	switch {
	case bad != nil:
		return t, bad
	case len(t.builtins) == 0:
	case named:
		t.calls = calls
	default:
		t.calls = defaultToolCalls
	}
	var items []members
	if jsonKind(m["input"]) == kindArray {
		_ = json.Unmarshal(m["input"], &items)
	}
	for i, item := range items {
		if typ, _ := item.str("type"); typ != "item_reference" {
			continue
		}
		param := "input[" + strconv.Itoa(i) + "].id"
		id, bad := item.str("id")
		if bad != nil {
			bad.param = param
			return t, bad
		}
		if id == "" {
			return t, &refusal{http.StatusBadRequest, "Missing required parameter: '" + param + "'.", "invalid_request_error", param, "missing_required_parameter"}
		}
		t.refs = append(t.refs, id)
	}
	return t, nil
}

// builtinTool matches the types of the Responses API's web search tools,
// dated variants included (web_search_2025_08_26,
// web_search_preview_2025_03_11).
var builtinTool = regexp.MustCompile(`^web_search(_preview)?(_\d{4}_\d{2}_\d{2})?$`)

// builtinKind is the kind of built-in tool a tool type names, the kind a
// bill counts its calls by; "" for a tool the model calls through the
// client (function, custom) or one the simulator does not bill (mcp).
func builtinKind(typ string) string {
	switch {
	case typ == ToolFileSearch, typ == ToolCodeInterpreter, typ == ToolImageGeneration:
		return typ
	case builtinTool.MatchString(typ):
		return ToolWebSearch
	}
	return ""
}

// str reads a string member; "" when absent or null.
func (m members) str(name string) (string, *refusal) {
	raw := m[name]
	switch k := jsonKind(raw); k {
	case 0:
		return "", nil
	case kindString:
		var s string
		_ = json.Unmarshal(raw, &s)
		return s, nil
	default:
		return "", invalidType(name, "a string", k)
	}
}

// integer reads an integer member within [lo, hi]; ok is false when it is
// absent or null. An integral number written as 1e3 or 100.0 is taken.
func (m members) integer(name string, lo, hi int64) (v int64, ok bool, bad *refusal) {
	raw := bytes.TrimSpace(m[name])
	switch k := jsonKind(raw); k {
	case 0:
		return 0, false, nil
	case kindNumber:
	default:
		return 0, false, invalidType(name, "an integer", k)
	}
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(string(raw), 64)
		if ferr != nil || f != math.Trunc(f) {
			return 0, false, &refusal{http.StatusBadRequest, "Invalid type for '" + name + "': expected an integer, but got a decimal number instead.",
				"invalid_request_error", name, "invalid_type"}
		}
		v = int64(max(min(f, math.MaxInt64/2), math.MinInt64/2))
	}
	switch {
	case v < lo:
		return 0, false, &refusal{http.StatusBadRequest, "Invalid '" + name + "': integer below minimum value. Expected a value >= " + itoa(lo) + ", but got " + itoa(v) + " instead.",
			"invalid_request_error", name, "integer_below_min_value"}
	case v > hi:
		return 0, false, &refusal{http.StatusBadRequest, "Invalid '" + name + "': integer above maximum value. Expected a value <= " + itoa(hi) + ", but got " + itoa(v) + " instead.",
			"invalid_request_error", name, "integer_above_max_value"}
	}
	return v, true, nil
}

// invalidType is OpenAI's 400 for a member of the wrong JSON kind.
func invalidType(name, want string, got int) *refusal {
	return &refusal{http.StatusBadRequest, "Invalid type for '" + name + "': expected " + want + ", but got " + kindName(got) + " instead.",
		"invalid_request_error", name, "invalid_type"}
}

// multiTurnInput is the input a response that makes k built-in tool calls
// is billed at worst: k+1 turns, each re-reading the prompt p and the o
// output tokens generated before the first call, the j-th turn the results
// of the j calls before it, r tokens each: (k+1)·p + r·k(k+1)/2 + k·o.
func multiTurnInput(p, r, o, k int64) int64 {
	return (k+1)*p + r*k*(k+1)/2 + k*o
}
