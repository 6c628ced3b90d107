package sim

import (
	"bytes"
	cryptorand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/llmq/llmq/internal/llm"
)

// BatchConfig configures the simulator's Files and Batches endpoints (OpenAI's
// Batch API). A batch's life is a function of the simulator's clock: it is
// validating for ValidatingFor, then in_progress while its lines are answered
// at LinesPerSecond, then finalizing for FinalizingFor, then completed; no
// goroutine runs it, every request brings the batches up to the clock. The
// settings of a batch are those in force when it was created, except the
// queue limits, read when it is validated.
type BatchConfig struct {
	// LinesPerSecond is how fast a batch in progress answers its lines, in
	// the input's order. Defaults to 5000; a negative value answers them all
	// the moment the batch is validated.
	LinesPerSecond float64 `json:"lines_per_second"`
	// ValidatingFor is how long a batch stays validating. Defaults to 50ms;
	// negative: no time at all.
	ValidatingFor time.Duration `json:"validating_for"`
	// FinalizingFor is how long a batch stays finalizing once its lines are
	// answered. Defaults to 50ms; negative: no time at all.
	FinalizingFor time.Duration `json:"finalizing_for"`
	// CancellingFor is how long a cancelled batch stays cancelling before it
	// is cancelled. Defaults to 100ms; negative: no time at all.
	CancellingFor time.Duration `json:"cancelling_for"`
	// MaxLines is the most requests a batch input file may hold; a file with
	// more fails validation (batch_size_exceeded). Defaults to 50,000.
	MaxLines int `json:"max_lines"`
	// MaxFileBytes is the largest file POST /v1/files takes. Defaults to
	// 200 MiB.
	MaxFileBytes int64 `json:"max_file_bytes"`
	// QueueLimit is every model's batch queue limit: the most prompt tokens
	// (counted as the rate limiter counts them) that the batches of one model
	// may hold enqueued, from the end of their validation until they end in
	// any way. A batch that would pass it fails validation with
	// token_limit_exceeded. 0 means no limit, the default.
	QueueLimit int64 `json:"queue_limit"`
	// QueueLimits replace QueueLimit for the models they name; 0 there means
	// no limit for that model. Defaults to none.
	QueueLimits map[string]int64 `json:"queue_limits"`
	// ExpireFraction makes every batch expire with this share of its lines
	// (rounded, the last ones of the input) never answered: they go to the
	// error file as batch_expired. Defaults to 0: batches expire only when
	// their lines would run past the 24 h completion window.
	ExpireFraction float64 `json:"expire_fraction"`
	// FailRate is the share of batches (drawn from the seed, per batch) that
	// pass validation, start, and then fail with a server_error having
	// answered no line, half-way through the time their lines would take.
	// Defaults to 0.
	FailRate float64 `json:"fail_rate"`
}

func (c BatchConfig) validate() error {
	switch {
	case math.IsNaN(c.LinesPerSecond):
		return fmt.Errorf("sim: Config.Batch.LinesPerSecond must be a number, got %v", c.LinesPerSecond)
	case c.MaxLines < 0:
		return fmt.Errorf("sim: Config.Batch.MaxLines must not be negative, got %d", c.MaxLines)
	case c.MaxFileBytes < 0:
		return fmt.Errorf("sim: Config.Batch.MaxFileBytes must not be negative, got %d", c.MaxFileBytes)
	case c.QueueLimit < 0:
		return fmt.Errorf("sim: Config.Batch.QueueLimit must not be negative, got %d", c.QueueLimit)
	case math.IsNaN(c.ExpireFraction) || c.ExpireFraction < 0 || c.ExpireFraction > 1:
		return fmt.Errorf("sim: Config.Batch.ExpireFraction must be within [0, 1], got %v", c.ExpireFraction)
	case math.IsNaN(c.FailRate) || c.FailRate < 0 || c.FailRate > 1:
		return fmt.Errorf("sim: Config.Batch.FailRate must be within [0, 1], got %v", c.FailRate)
	}
	for model, n := range c.QueueLimits {
		if n < 0 {
			return fmt.Errorf("sim: Config.Batch.QueueLimits[%s] must not be negative, got %d", model, n)
		}
	}
	return nil
}

func (c *BatchConfig) setDefaults() {
	if c.LinesPerSecond == 0 {
		c.LinesPerSecond = 5000
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&c.ValidatingFor, 50 * time.Millisecond}, {&c.FinalizingFor, 50 * time.Millisecond}, {&c.CancellingFor, 100 * time.Millisecond}} {
		switch {
		case *d.v == 0:
			*d.v = d.def
		case *d.v < 0:
			*d.v = 0
		}
	}
	if c.MaxLines == 0 {
		c.MaxLines = 50_000
	}
	if c.MaxFileBytes == 0 {
		c.MaxFileBytes = 200 << 20
	}
	// The caller keeps its map.
	limits := make(map[string]int64, len(c.QueueLimits))
	for k, v := range c.QueueLimits {
		limits[k] = v
	}
	c.QueueLimits = limits
}

// BatchStats counts what the Files and Batches endpoints did since the
// simulator started (or was reset).
type BatchStats struct {
	// FilesUploaded is files taken by POST /v1/files.
	FilesUploaded int64 `json:"files_uploaded"`
	// BatchesCreated is batches taken by POST /v1/batches; the others count
	// how they ended.
	BatchesCreated   int64 `json:"batches_created"`
	BatchesCompleted int64 `json:"batches_completed"`
	BatchesFailed    int64 `json:"batches_failed"`
	BatchesExpired   int64 `json:"batches_expired"`
	BatchesCancelled int64 `json:"batches_cancelled"`
	// LinesProcessed is batch lines answered, successfully or with an
	// error. Lines never count against the rate limits nor in Stats'
	// request counters; their usage is in Stats' PromptTokens and
	// CompletionTokens.
	LinesProcessed int64 `json:"lines_processed"`
	// LinesRepeated is the lines answered whose custom_id had been answered
	// before, in any batch: 0 when no line ran twice.
	LinesRepeated int64 `json:"lines_repeated"`
	// EnqueuedTokens is, by model, the prompt tokens its batches hold in the
	// batch queue now (Config.Batch.QueueLimit); models holding none are
	// left out.
	EnqueuedTokens map[string]int64 `json:"enqueued_tokens"`
}

// The statuses of a batch.
const (
	batchValidating = "validating"
	batchFailed     = "failed"
	batchInProgress = "in_progress"
	batchFinalizing = "finalizing"
	batchCompleted  = "completed"
	batchExpired    = "expired"
	batchCancelling = "cancelling"
	batchCancelled  = "cancelled"
)

// maxBatchErrors bounds the validation errors a batch lists.
const maxBatchErrors = 100

// batchStore holds the files and batches. Its lock is taken before the
// server's, never after.
type batchStore struct {
	mu        sync.Mutex
	cfg       BatchConfig
	files     map[string]*file
	batches   map[string]*batch
	order     []*batch // by creation
	active    []*batch // not ended, by creation
	nextFile  uint64
	nextBatch uint64
	enqueued  map[string]int64 // by model
	stats     BatchStats
	runs      map[string]int64 // by custom_id
}

func newBatchStore(cfg BatchConfig) *batchStore {
	return &batchStore{
		cfg:      cfg,
		files:    make(map[string]*file),
		batches:  make(map[string]*batch),
		enqueued: make(map[string]int64),
		runs:     make(map[string]int64),
	}
}

// queueLimit is model's batch queue limit; 0 for none.
func (st *batchStore) queueLimit(model string) int64 {
	if n, ok := st.cfg.QueueLimits[model]; ok {
		return n
	}
	return st.cfg.QueueLimit
}

// batch is one batch and its plan: the moments of its transitions follow
// from its creation, its settings and, once it is validated, its lines.
type batch struct {
	num         uint64 // 1, 2, … in creation order
	id          string
	endpoint    string // as the client gave it
	api         string // the simulator's endpoint it names
	inputFileID string
	metadata    map[string]string
	cfg         BatchConfig
	created     time.Time

	// What parsing the input file found, at creation.
	lines   []batchLine
	total   int // len(lines), kept when they are dropped
	model   string
	tokens  int64        // the prompt tokens it enqueues
	invalid []batchError // validation errors; none when valid

	status                                       string
	errors                                       []batchError
	inProgressAt, finalizingAt, completedAt      time.Time
	failedAt, expiredAt, cancellingAt, cancelled time.Time
	// The plan made at validation: runN lines are answered, the last at
	// end, which is when the batch fails, expires or finalizes (endStatus).
	runN      int
	end       time.Time
	endStatus string
	done      int // lines answered
	completed int // of them, answered 200
	failed    int // of them, answered with an error
	reserved  bool
	outputID  string
	errorID   string
}

// batchLine is one request of a batch.
type batchLine struct {
	customID string
	call     *call    // nil when bad
	bad      *refusal // the answer the simulator gives the body at once
	status   int      // of the answer; 0 until answered
	result   []byte   // the output or error file's line
}

// batchError is one entry of a batch's errors.
type batchError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

func newBatchError(line int, code, param, message string) batchError {
	e := batchError{Code: code, Message: message}
	if param != "" {
		e.Param = &param
	}
	if line > 0 {
		e.Line = &line
	}
	return e
}

// lineTime is how long answering k lines takes.
func (b *batch) lineTime(k int) time.Duration {
	if b.cfg.LinesPerSecond < 0 {
		return 0
	}
	// At most a century: past the completion window anyway, and within a
	// Duration.
	d := float64(k) / b.cfg.LinesPerSecond * float64(time.Second)
	if d > float64(100*365*24*time.Hour) {
		return 100 * 365 * 24 * time.Hour
	}
	return time.Duration(d)
}

// linesBy is how many lines of the plan are answered at t.
func (b *batch) linesBy(t time.Time, limit int) int {
	if b.cfg.LinesPerSecond < 0 {
		return limit
	}
	d := t.Sub(b.inProgressAt)
	if d <= 0 {
		return 0
	}
	k := math.Floor(d.Seconds() * b.cfg.LinesPerSecond)
	if k >= float64(limit) {
		return limit
	}
	return int(k)
}

// nextEvent is the moment of the batch's next transition; false once it
// has ended.
func (b *batch) nextEvent() (time.Time, bool) {
	switch b.status {
	case batchValidating:
		return b.created.Add(b.cfg.ValidatingFor), true
	case batchInProgress:
		return b.end, true
	case batchFinalizing:
		return b.finalizingAt.Add(b.cfg.FinalizingFor), true
	case batchCancelling:
		return b.cancellingAt.Add(b.cfg.CancellingFor), true
	}
	return time.Time{}, false
}

// advanceBatchesLocked brings every batch to now: the transitions due, in
// time order across batches (one batch's end frees the queue for another's
// validation), then the lines due.
func (s *Server) advanceBatchesLocked(now time.Time) {
	st := s.bat
	for {
		var next *batch
		var at time.Time
		for _, b := range st.active {
			if t, ok := b.nextEvent(); ok && !t.After(now) && (next == nil || t.Before(at)) {
				next, at = b, t
			}
		}
		if next == nil {
			break
		}
		s.stepBatchLocked(next, at)
	}
	active := st.active[:0]
	for _, b := range st.active {
		if b.status == batchInProgress {
			s.answerLinesLocked(b, b.linesBy(now, b.runN))
		}
		if _, ok := b.nextEvent(); ok {
			active = append(active, b)
		}
	}
	clear(st.active[len(active):])
	st.active = active
}

// stepBatchLocked makes b's next transition, due at at.
func (s *Server) stepBatchLocked(b *batch, at time.Time) {
	switch b.status {
	case batchValidating:
		s.validateBatchLocked(b, at)
	case batchInProgress:
		s.answerLinesLocked(b, b.runN)
		switch b.endStatus {
		case batchFinalizing:
			b.status, b.finalizingAt = batchFinalizing, at
		case batchFailed:
			b.errors = []batchError{newBatchError(0, "server_error", "", "The batch failed because of an error on our side. Please try again.")}
			s.endBatchLocked(b, batchFailed, at)
		default:
			s.endBatchLocked(b, batchExpired, at)
		}
	case batchFinalizing:
		s.endBatchLocked(b, batchCompleted, at)
	case batchCancelling:
		s.endBatchLocked(b, batchCancelled, at)
	}
}

// validateBatchLocked ends b's validation at at: it fails for the errors its
// input file holds, or for the queue limit of its model; otherwise it
// enqueues its tokens, starts, and plans its end.
func (s *Server) validateBatchLocked(b *batch, at time.Time) {
	st := s.bat
	if len(b.invalid) > 0 {
		b.errors = b.invalid
		s.endBatchLocked(b, batchFailed, at)
		return
	}
	if limit := st.queueLimit(b.model); limit > 0 && st.enqueued[b.model]+b.tokens > limit {
		b.errors = []batchError{newBatchError(0, "token_limit_exceeded", "",
			"Enqueued token limit reached for "+b.model+" in organization org-sim. Limit: "+commas(limit)+
				" enqueued tokens. Please try again once some in_progress batches have been completed.")}
		s.endBatchLocked(b, batchFailed, at)
		return
	}
	st.enqueued[b.model] += b.tokens
	b.reserved = true
	b.status, b.inProgressAt = batchInProgress, at
	n := len(b.lines)
	b.runN, b.endStatus, b.end = n, batchFinalizing, at.Add(b.lineTime(n))
	if b.cfg.FailRate > 0 && s.draw(1<<62|b.num, 0) < b.cfg.FailRate {
		b.runN, b.endStatus, b.end = 0, batchFailed, at.Add(b.lineTime(n)/2)
		return
	}
	if undone := int(math.Round(b.cfg.ExpireFraction * float64(n))); undone > 0 {
		b.runN, b.endStatus, b.end = n-undone, batchExpired, at.Add(b.lineTime(n-undone))
	}
	// The completion window: lines that would run past it never do.
	if expires := b.created.Add(24 * time.Hour); b.end.After(expires) {
		b.runN, b.endStatus, b.end = b.linesBy(expires, b.runN), batchExpired, expires
	}
}

// answerLinesLocked answers b's lines up to the upto-th, each at the moment
// the plan gives it.
func (s *Server) answerLinesLocked(b *batch, upto int) {
	st := s.bat
	for ; b.done < upto; b.done++ {
		i := b.done
		l := &b.lines[i]
		at := b.inProgressAt.Add(b.lineTime(i + 1))
		// Batch lines draw from their own range of request numbers, so
		// synchronous traffic does not change their answers.
		n := 1<<63 | b.num<<32 | uint64(i)
		bad := l.bad
		if bad == nil {
			bad = s.exceedsContext(l.call)
		}
		var body []byte
		if bad != nil {
			l.status = bad.status
			body = errorBody(bad.message, bad.typ, bad.param, bad.code)
			b.failed++
		} else {
			l.status = http.StatusOK
			var bill Bill
			body, bill = s.respond(l.call, n, at)
			bill.Batch, bill.RequestID = true, s.ident("req_", identRequest, n)
			s.record(bill)
			b.completed++
		}
		l.result = resultLine(s.ident("batch_req_", identBatchRequest, n), l.customID, l.status,
			s.ident("req_", identRequest, n), bytes.TrimSuffix(body, []byte("\n")))
		l.call = nil
		st.stats.LinesProcessed++
		if st.runs[l.customID] > 0 {
			st.stats.LinesRepeated++
		}
		st.runs[l.customID]++
	}
}

// endBatchLocked ends b at at with status: it leaves the queue, and but for
// a failure writes its output and error files.
func (s *Server) endBatchLocked(b *batch, status string, at time.Time) {
	st := s.bat
	b.status = status
	switch status {
	case batchCompleted:
		b.completedAt = at
		st.stats.BatchesCompleted++
	case batchFailed:
		b.failedAt = at
		st.stats.BatchesFailed++
	case batchExpired:
		b.expiredAt = at
		st.stats.BatchesExpired++
	case batchCancelled:
		b.cancelled = at
		st.stats.BatchesCancelled++
	}
	if b.reserved {
		b.reserved = false
		if st.enqueued[b.model] -= b.tokens; st.enqueued[b.model] <= 0 {
			delete(st.enqueued, b.model)
		}
	}
	if status == batchFailed {
		b.lines = nil
		return
	}
	var out, errs [][]byte
	for i := range b.lines {
		l := &b.lines[i]
		switch {
		case l.status == http.StatusOK:
			out = append(out, l.result)
		case l.status != 0:
			errs = append(errs, l.result)
		case b.inProgressAt.IsZero():
			// Cancelled while validating: its lines were never taken.
		case status == batchExpired:
			errs = append(errs, undoneLine(s.ident("batch_req_", identBatchRequest, 1<<63|b.num<<32|uint64(i)), l.customID,
				"batch_expired", "This request could not be executed before the completion window expired."))
		default:
			errs = append(errs, undoneLine(s.ident("batch_req_", identBatchRequest, 1<<63|b.num<<32|uint64(i)), l.customID,
				"batch_cancelled", "This request could not be executed before the batch was cancelled."))
		}
	}
	// The files do not follow the input's order, as OpenAI's do not.
	rng := rand.New(rand.NewPCG(s.cfg.Seed, b.num))
	if len(out) > 0 {
		b.outputID = s.addFileLocked("batch_"+b.id+"_output.jsonl", "batch_output", at, joinLines(shuffled(rng, out))).id
	}
	if len(errs) > 0 {
		b.errorID = s.addFileLocked("batch_"+b.id+"_error.jsonl", "batch_output", at, joinLines(shuffled(rng, errs))).id
	}
	b.lines = nil
}

// shuffled returns lines in an order drawn from rng, never their own when
// there are two or more.
func shuffled(rng *rand.Rand, lines [][]byte) [][]byte {
	perm := rng.Perm(len(lines))
	identity := true
	for i, p := range perm {
		if i != p {
			identity = false
			break
		}
	}
	if identity && len(perm) > 1 {
		perm[0], perm[1] = perm[1], perm[0]
	}
	out := make([][]byte, len(lines))
	for i, p := range perm {
		out[i] = lines[p]
	}
	return out
}

func joinLines(lines [][]byte) []byte {
	n := 0
	for _, l := range lines {
		n += len(l) + 1
	}
	b := make([]byte, 0, n)
	for _, l := range lines {
		b = append(b, l...)
		b = append(b, '\n')
	}
	return b
}

// resultLine is a line of a batch's output or error file for an answered
// request.
func resultLine(id, customID string, status int, requestID string, body []byte) []byte {
	var b bytes.Buffer
	b.Grow(len(body) + len(customID) + 128)
	b.WriteString(`{"id":`)
	appendJSONString(&b, id)
	b.WriteString(`,"custom_id":`)
	appendJSONString(&b, customID)
	b.WriteString(`,"response":{"status_code":`)
	b.WriteString(strconv.Itoa(status))
	b.WriteString(`,"request_id":`)
	appendJSONString(&b, requestID)
	b.WriteString(`,"body":`)
	b.Write(body)
	b.WriteString(`},"error":null}`)
	return b.Bytes()
}

// undoneLine is a line of a batch's error file for a request never
// answered.
func undoneLine(id, customID, code, message string) []byte {
	var b bytes.Buffer
	b.WriteString(`{"id":`)
	appendJSONString(&b, id)
	b.WriteString(`,"custom_id":`)
	appendJSONString(&b, customID)
	b.WriteString(`,"response":null,"error":{"code":`)
	appendJSONString(&b, code)
	b.WriteString(`,"message":`)
	appendJSONString(&b, message)
	b.WriteString(`}}`)
	return b.Bytes()
}

// parseBatchInput reads b's input file: its lines, its model and its
// enqueued tokens, or the errors that fail its validation. On Azure's paths
// (azure) a line's url may leave out the /v1.
func (s *Server) parseBatchInput(b *batch, data []byte, azure bool) {
	type seen struct{ line int }
	ids := map[string]seen{}
	var errs []batchError
	addErr := func(e batchError) {
		if len(errs) < maxBatchErrors {
			errs = append(errs, e)
		}
	}
	var bodies [][]byte
	lineNo := 0
	for len(data) > 0 {
		var line []byte
		line, data, _ = bytes.Cut(data, []byte("\n"))
		lineNo++
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		if len(b.lines) == b.cfg.MaxLines {
			b.lines, b.invalid = nil, []batchError{newBatchError(0, "batch_size_exceeded", "",
				fmt.Sprintf("The batch input file holds more than %d requests, the most a batch may hold.", b.cfg.MaxLines))}
			return
		}
		var req map[string]json.RawMessage
		if json.Unmarshal(line, &req) != nil || req == nil {
			addErr(newBatchError(lineNo, "invalid_json_line", "", "This line is not parseable as valid JSON."))
			continue
		}
		str := func(key string) (string, bool) {
			var v string
			raw, ok := req[key]
			if !ok || json.Unmarshal(raw, &v) != nil {
				return "", false
			}
			return v, true
		}
		customID, ok := str("custom_id")
		method, _ := str("method")
		url, _ := str("url")
		body := req["body"]
		switch {
		case !ok || customID == "":
			addErr(newBatchError(lineNo, "missing_required_parameter", "custom_id", "Missing required parameter: 'custom_id' (a non-empty string)."))
			continue
		case method != http.MethodPost:
			addErr(newBatchError(lineNo, "invalid_method", "method", fmt.Sprintf("The method '%s' is not supported: a batch request's method must be 'POST'.", method)))
			continue
		case url != b.endpoint && !(azure && batchEndpoint(url, true) == b.api):
			addErr(newBatchError(lineNo, "invalid_url", "url", fmt.Sprintf("The URL '%s' of this request does not match the batch's endpoint '%s'.", url, b.endpoint)))
			continue
		case len(body) == 0 || body[0] != '{':
			addErr(newBatchError(lineNo, "missing_required_parameter", "body", "Missing required parameter: 'body' (the request, a JSON object)."))
			continue
		}
		if prev, dup := ids[customID]; dup {
			addErr(newBatchError(lineNo, "duplicate_custom_id", "custom_id", fmt.Sprintf("The custom_id '%s' is already the custom_id of line %d: the custom_id of each request in a batch must be unique.", customID, prev.line)))
			continue
		}
		ids[customID] = seen{lineNo}
		var m struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(body, &m)
		switch {
		case m.Model == "":
		case b.model == "":
			b.model = m.Model
		case m.Model != b.model:
			addErr(newBatchError(lineNo, "mismatched_model", "model", fmt.Sprintf("This request's model '%s' differs from the batch's model '%s': the requests of a batch must all use one model.", m.Model, b.model)))
			continue
		}
		b.lines = append(b.lines, batchLine{customID: customID})
		bodies = append(bodies, body)
	}
	switch {
	case len(errs) > 0:
		b.lines, b.invalid = nil, errs
		return
	case len(b.lines) == 0:
		b.invalid = []batchError{newBatchError(0, "empty_file", "", "The batch input file holds no request.")}
		return
	}
	// A valid file: each body as the synchronous endpoint would take it.
	for i, body := range bodies {
		l := &b.lines[i]
		rest, stream, _, err := streamRequest(b.api, body)
		switch {
		case err != nil:
			l.bad = &refusal{http.StatusBadRequest, err.Error(), "invalid_request_error", "stream", ""}
		case stream:
			l.bad = &refusal{http.StatusBadRequest, "Streaming is not supported in the Batch API.", "invalid_request_error", "stream", ""}
		default:
			l.call, l.bad = s.prepare(b.api, rest)
		}
		if l.call != nil {
			b.tokens += l.call.prompt
		}
	}
}

// batchEndpoint is the simulator's endpoint that a batch's endpoint names;
// "" for one it does not serve. Azure's paths may leave out the /v1.
func batchEndpoint(endpoint string, azure bool) string {
	if azure && !strings.HasPrefix(endpoint, "/v1/") {
		endpoint = "/v1" + endpoint
	}
	switch endpoint {
	case llm.EndpointChat, llm.EndpointEmbeddings, llm.EndpointResponses:
		return endpoint
	}
	return ""
}

// The kinds of identifiers.
const (
	identFile = iota + 1
	identBatch
	identBatchRequest
	identRequest
	identResponse
	identMessage
	identChat
	identToolCall
	identAnthropicMessage
)

// ident is the n-th identifier of a kind: prefix and 24 hex digits, unique
// for the kind and the same for a seed, so a run repeats. With
// Config.RandomIDs the digits come from crypto/rand instead, so nobody can
// guess another client's ids from the seed and a counter.
func (s *Server) ident(prefix string, kind, n uint64) string {
	if s.cfg.RandomIDs {
		var b [12]byte
		_, _ = cryptorand.Read(b[:]) // never fails (crypto/rand)
		return prefix + hex.EncodeToString(b[:])
	}
	x := mix64(mix64(s.cfg.Seed+kind*0x9E3779B97F4A7C15) + n)
	return fmt.Sprintf("%s%016x%08x", prefix, x, uint32(mix64(x)))
}

// mix64 is splitmix64's finalizer, a bijection.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return x
}

// commas writes n with thousands separators, as OpenAI's messages do.
func commas(n int64) string {
	s := itoa(n)
	if n < 0 {
		return "-" + commas(-n)
	}
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// BatchStats returns the Files and Batches endpoints' counters, with the
// batches brought up to the simulator's clock.
func (s *Server) BatchStats() BatchStats {
	st := s.bat
	st.mu.Lock()
	defer st.mu.Unlock()
	s.advanceBatchesLocked(s.cfg.Now())
	out := st.stats
	out.EnqueuedTokens = make(map[string]int64, len(st.enqueued))
	for k, v := range st.enqueued {
		out.EnqueuedTokens[k] = v
	}
	return out
}

// CustomIDRuns returns, for each custom_id of a batch line answered since the
// simulator started (or was reset), how many times a line with it was
// answered, across all batches.
func (s *Server) CustomIDRuns() map[string]int64 {
	st := s.bat
	st.mu.Lock()
	defer st.mu.Unlock()
	s.advanceBatchesLocked(s.cfg.Now())
	out := make(map[string]int64, len(st.runs))
	for k, v := range st.runs {
		out[k] = v
	}
	return out
}

// SetBatchConfig replaces the batch settings: for batches created from now
// on, and the queue limits for batches validated from now on.
func (s *Server) SetBatchConfig(c BatchConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	c.setDefaults()
	st := s.bat
	st.mu.Lock()
	defer st.mu.Unlock()
	s.advanceBatchesLocked(s.cfg.Now())
	st.cfg = c
	return nil
}

// resetBatchStats clears the batch counters; files and batches stay.
func (s *Server) resetBatchStats() {
	st := s.bat
	st.mu.Lock()
	defer st.mu.Unlock()
	st.stats = BatchStats{}
	st.runs = make(map[string]int64)
}
