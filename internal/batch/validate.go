package batch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/admission"
	"github.com/llmq/llmq/internal/budget"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/jsontext"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// maxListedErrors is how many refused lines the batch object lists in its
// "errors"; the error file has every one.
const maxListedErrors = 100

// Validate turns a validating batch's input file into jobs (see the package
// doc). No task reaches Redis before the last line is checked; a file with
// no valid line fails the batch. It returns at once when another process
// holds the batch; run again after a crash, it skips the lines already
// stored; cancelled meanwhile, it cancels what it stored.
func (s *Service) Validate(ctx context.Context, batchID string) error {
	unlock, ok, err := s.Store.TryLock(ctx, lockName(batchID))
	if err != nil || !ok {
		return err
	}
	defer unlock()
	b, err := s.Store.BatchGetByID(ctx, batchID)
	if err != nil {
		return err
	}
	if b.Status != store.BatchValidating {
		return nil
	}
	if s.expired(b) {
		return s.expireValidating(ctx, b)
	}
	tenant, err := s.Store.TenantGetByID(ctx, b.TenantID)
	if err != nil {
		return err
	}
	p := s.Policy.Current()
	acct, tier, err := admission.Account(p, tenant)
	if err != nil {
		// The tenant's tier has left the policy: no line can be judged, and
		// trying again every sweep would only log the same error.
		return s.finish(ctx, b, store.BatchFailed, nil, []client.BatchError{{Code: client.CodeTierNotFound, Message: err.Error()}})
	}
	v := &validation{s: s, b: b, policy: p, acct: acct, tier: tier, seen: map[[16]byte]int{}}
	if err := v.loadExisting(ctx); err != nil {
		return err
	}
	if err := v.run(ctx); err != nil {
		if ctx.Err() != nil || !s.Store.IsPermanent(err) {
			return err
		}
		return v.failed(ctx, err)
	}
	return v.conclude(ctx)
}

// validation is one pass over a batch's input file.
type validation struct {
	s      *Service
	b      *store.Batch
	policy *config.Policy
	acct   budget.Account
	tier   *config.Tier

	existing map[int]bool     // lines stored by an earlier, interrupted pass
	seen     map[[16]byte]int // sha-256 prefix of each custom_id -> its first line
	errs     []client.BatchError

	total, valid, refused int64

	group      []*store.JobInsertParams
	groupBytes int
	queued     []queue.JobRef // the queued jobs this pass stored
	offloaded  int64          // of them, put in parts for the provider's Batch API
	stopped    bool           // the batch left validating (it was cancelled)
}

// loadExisting finds the lines an interrupted pass stored already.
func (v *validation) loadExisting(ctx context.Context) error {
	v.existing = map[int]bool{}
	return v.s.Store.JobStreamByBatch(ctx, v.b.ID, nil, func(j *store.Job) error {
		v.existing[j.LineNo] = true
		return nil
	})
}

// run reads the input file, checking each line and inserting group by
// group.
func (v *validation) run(ctx context.Context) error {
	f, err := v.s.Store.FileOpen(ctx, v.b.InputFileID)
	if err != nil {
		return err
	}
	defer f.Close()
	lr := &lineReader{br: bufio.NewReaderSize(f, 64<<10), max: maxLineBytes}
	for !v.stopped {
		no, line, tooLong, err := lr.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read input file %s: %w", v.b.InputFileID, err)
		}
		if !tooLong && len(bytes.TrimSpace(line)) == 0 {
			continue // blank lines are not requests
		}
		v.total++
		job, err := v.check(ctx, no, line, tooLong)
		if err != nil {
			return err
		}
		if job.Status == store.JobFailed {
			v.refused++
		} else {
			v.valid++
		}
		if v.existing[no] {
			continue
		}
		v.group = append(v.group, job)
		v.groupBytes += len(job.Request)
		if len(v.group) >= v.s.opts.GroupLines || v.groupBytes >= groupBytes {
			if err := v.flush(ctx); err != nil {
				return err
			}
		}
	}
	return v.flush(ctx)
}

// flush inserts the group (one COPY) and keeps its queued jobs for the
// enqueue at the end, unless the batch was cancelled meanwhile.
func (v *validation) flush(ctx context.Context) error {
	if len(v.group) == 0 {
		return nil
	}
	b, err := v.s.Store.BatchGetByID(ctx, v.b.ID)
	if err != nil {
		return err
	}
	if b.Status != store.BatchValidating {
		v.stopped, v.group = true, nil
		return nil
	}
	ids, err := v.s.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: v.group})
	if errors.Is(err, store.ErrConflict) {
		// Lines of this group are stored already: an earlier pass that gave
		// up while inserting them (its insert committed after it stopped
		// waiting). Keep what it stored, insert the rest.
		v.s.Logger.Debug("batch lines already stored by an earlier pass; inserting the rest", "batch", v.b.ID,
			"first", v.group[0].LineNo, "last", v.group[len(v.group)-1].LineNo)
		if err := v.loadExisting(ctx); err != nil {
			return err
		}
		v.group = slices.DeleteFunc(v.group, func(j *store.JobInsertParams) bool { return v.existing[j.LineNo] })
		if len(v.group) == 0 {
			v.groupBytes = 0
			return nil
		}
		ids, err = v.s.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: v.group})
	}
	if err != nil && ctx.Err() == nil && v.s.Store.IsPermanent(err) && !errors.Is(err, store.ErrConflict) {
		// The store refuses something in the group: each line goes on its
		// own, and a line it refuses is that line's failure, not the batch's.
		ids, err = v.insertOneByOne(ctx)
	}
	if err != nil {
		return &groupError{first: v.group[0].LineNo, last: v.group[len(v.group)-1].LineNo, err: err}
	}
	for i, j := range v.group {
		if j.Status != store.JobFailed {
			v.queued = append(v.queued, admission.Ref(v.policy, ids[i], queue.Batch, v.b.TenantID, j.Model, j.EstPromptTokens+j.EstMaxTokens, v.tier.Share))
		}
	}
	v.group, v.groupBytes = nil, 0
	return nil
}

// conclude moves the batch on: in_progress, or failed without a valid line.
func (v *validation) conclude(ctx context.Context) error {
	s, b := v.s, v.b
	if v.stopped {
		return v.cancelled(ctx)
	}
	total := v.total
	errs := v.errorList()
	if v.valid == 0 {
		if v.total == 0 {
			errs = []client.BatchError{{Code: client.CodeEmptyFile, Message: "The input file has no request lines."}}
		}
		return s.finish(ctx, b, store.BatchFailed, &total, errs)
	}
	if s.Offload != nil {
		// Before in_progress: a crash in between plans again the lines in
		// no part, and none of them was enqueued yet.
		n, err := s.Offload.Plan(ctx, b, v.policy, v.tier)
		if err != nil {
			return err
		}
		v.offloaded = n
	}
	nb, applied, err := s.Store.BatchSetStatus(ctx, &store.BatchSetStatusParams{ID: b.ID,
		From: []store.BatchStatus{store.BatchValidating}, To: store.BatchInProgress,
		Total: &total, Errors: errorsJSON(errs)})
	if err != nil {
		return err
	}
	if !applied {
		if nb.Status == store.BatchCancelling {
			return v.cancelled(ctx)
		}
		return nil
	}
	s.Logger.Info("batch validated", "batch", b.ID, "lines", v.total, "valid", v.valid, "refused", v.refused, "offloaded", v.offloaded)
	v.enqueue(ctx)
	return nil
}

// enqueue hands the validated batch's queued jobs to the queue. A failure
// is only logged: the reconciler enqueues stored jobs that have no task.
func (v *validation) enqueue(ctx context.Context) {
	refs, err := v.queued, error(nil)
	if len(v.existing) > 0 || v.offloaded > 0 {
		// The interrupted pass stored lines this one skipped, or some lines
		// went to the provider's Batch API: take the queued jobs of the
		// batch on llmq's own path from the store.
		refs, err = v.storedRefs(ctx)
	}
	if err == nil {
		_, err = v.s.Queue.EnqueueJobs(ctx, refs)
	}
	if err != nil && ctx.Err() == nil {
		v.s.Logger.Warn("enqueue batch jobs failed; the reconciler will enqueue them", "batch", v.b.ID, "err", err)
	}
}

// cancelStored cancels the jobs a batch's validation stored and returns the
// batch's total: the requests it stored, so its counts agree with its output
// and error files (lines read but not yet stored are in neither).
func (s *Service) cancelStored(ctx context.Context, batchID string) (total *int64, err error) {
	if _, err := s.Store.JobCancelByBatch(ctx, batchID); err != nil {
		return nil, err
	}
	c, err := s.Store.JobCountsByBatch(ctx, batchID)
	if err != nil {
		return nil, err
	}
	return &c.Total, nil
}

// cancelled ends a validation whose batch was cancelled.
func (v *validation) cancelled(ctx context.Context) error {
	total, err := v.s.cancelStored(ctx, v.b.ID)
	if err != nil {
		return err
	}
	_, _, err = v.s.Store.BatchSetStatus(ctx, &store.BatchSetStatusParams{ID: v.b.ID,
		From: []store.BatchStatus{store.BatchCancelling}, To: store.BatchCancelling, Total: total})
	return err
}

// failed ends a validation that the database refuses for good (see
// permanent): retried, it would fail the same way at every sweep. Nothing
// of the batch was enqueued; the batch fails with the database's reason.
func (v *validation) failed(ctx context.Context, cause error) error {
	s := v.s
	s.Logger.Warn("batch lines cannot be stored; the batch fails", "batch", v.b.ID, "err", cause)
	total, err := v.s.cancelStored(ctx, v.b.ID)
	if err != nil {
		return err
	}
	msg := "The input file could not be read or stored"
	var ge *groupError
	if errors.As(cause, &ge) {
		msg = fmt.Sprintf("Lines %d to %d could not be stored", ge.first, ge.last)
	}
	msg += ", and trying again would not help. No request of the batch ran."
	return s.finish(ctx, v.b, store.BatchFailed, total, []client.BatchError{{Code: client.CodeValidationFailed, Message: msg}})
}

// insertOneByOne inserts the group's lines one at a time. A line the store
// refuses is stored failed in its place, without its body, with an error
// that says so in llmq's words (never the database's).
func (v *validation) insertOneByOne(ctx context.Context) ([]string, error) {
	ids := make([]string, len(v.group))
	for i, j := range v.group {
		got, err := v.s.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: []*store.JobInsertParams{j}})
		if err == nil {
			ids[i] = got[0]
			continue
		}
		if ctx.Err() != nil || !v.s.Store.IsPermanent(err) {
			return nil, err
		}
		v.s.Logger.Warn("a batch line cannot be stored; it fails alone", "batch", v.b.ID, "line", j.LineNo, "err", err)
		if j.Status != store.JobFailed {
			v.valid--
			v.refused++
		}
		msg := fmt.Sprintf("Line %d: the line could not be stored (the database refused a value in it).", j.LineNo)
		failed := &store.JobInsertParams{TenantID: j.TenantID, BatchID: j.BatchID, LineNo: j.LineNo, CustomID: j.CustomID,
			Endpoint: j.Endpoint, Model: j.Model, Queue: j.Queue, Status: store.JobFailed,
			Error: &store.JobError{Message: msg, Type: wire.TypeInvalidRequest, Code: client.CodeLineUnstorable}}
		v.list(j.LineNo, client.CodeLineUnstorable, "", msg)
		got, err = v.s.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: []*store.JobInsertParams{failed}})
		if err != nil && ctx.Err() == nil && v.s.Store.IsPermanent(err) {
			// its custom_id may be what the store refuses
			failed.CustomID, failed.Model = "", ""
			got, err = v.s.Store.JobInsertMany(ctx, &store.JobInsertManyParams{Jobs: []*store.JobInsertParams{failed}})
		}
		if err != nil {
			return nil, err
		}
		ids[i], v.group[i] = got[0], failed
	}
	return ids, nil
}

// groupError is a failed insert of the lines first to last.
type groupError struct {
	first, last int
	err         error
}

func (e *groupError) Error() string {
	return fmt.Sprintf("store lines %d to %d: %v", e.first, e.last, e.err)
}
func (e *groupError) Unwrap() error { return e.err }

// storedRefs is every queued job of the batch in the store that is in no
// part for the provider's Batch API (enqueueing one whose task exists
// already is a no-op).
func (v *validation) storedRefs(ctx context.Context) ([]queue.JobRef, error) {
	var refs []queue.JobRef
	err := v.s.Store.JobStreamByBatch(ctx, v.b.ID, []store.JobStatus{store.JobQueued}, func(j *store.Job) error {
		if j.BatchPartID == "" {
			refs = append(refs, admission.JobRef(v.policy, j, v.tier.Share))
		}
		return nil
	})
	return refs, err
}

// errorList is the batch's "errors": the first refused lines, and a last
// entry counting the others.
func (v *validation) errorList() []client.BatchError {
	errs := v.errs
	if v.refused > int64(len(errs)) {
		errs = append(errs, client.BatchError{Code: client.CodeMoreErrors, Message: fmt.Sprintf(
			"%d more lines were refused; the batch's error file lists every refused line.", v.refused-int64(len(errs)))})
	}
	return errs
}

// errorsJSON is a batch's "errors" as stored; none is nil.
func errorsJSON(errs []client.BatchError) json.RawMessage {
	if len(errs) == 0 {
		return nil
	}
	b, _ := json.Marshal(client.BatchErrors{Object: "list", Data: errs}) // plain structs: cannot fail
	return b
}

// requestLine is one line of a batch input file.
type requestLine struct {
	CustomID *string         `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// check judges one line and returns the job it becomes: queued, or failed
// with the reason; err is a store that could not judge it now (the
// validation runs again).
func (v *validation) check(ctx context.Context, no int, line []byte, tooLong bool) (*store.JobInsertParams, error) {
	b := v.b
	job := &store.JobInsertParams{TenantID: b.TenantID, BatchID: b.ID, LineNo: no, Endpoint: b.Endpoint, Queue: queue.Batch}
	var req requestLine
	le := v.parse(no, line, tooLong, &req)
	if req.CustomID != nil {
		job.CustomID = *req.CustomID // parse dropped one that cannot be stored
	}
	if le == nil {
		var err error
		if le, err = v.admit(ctx, req.Body, job); err != nil || le == nil {
			return job, err
		}
	}
	// Keep the model the line named, when it named one, for listings.
	var named struct {
		Model string `json:"model"`
	}
	if json.Unmarshal(req.Body, &named) == nil && len(named.Model) <= 256 && !strings.ContainsRune(named.Model, 0) {
		job.Model = named.Model
	}
	msg := fmt.Sprintf("Line %d: %s", no, le.Message)
	job.Status = store.JobFailed
	job.Error = &store.JobError{Message: msg, Type: wire.TypeInvalidRequest, Code: le.Code, Param: le.Param}
	v.list(no, le.Code, le.Param, msg)
	return job, nil
}

// list adds a refused line to the batch's "errors", up to maxListedErrors.
func (v *validation) list(no int, code client.Code, param, msg string) {
	if len(v.errs) < maxListedErrors {
		e := client.BatchError{Code: code, Message: msg, Line: &no}
		if param != "" {
			e.Param = &param
		}
		v.errs = append(v.errs, e)
	}
}

// parse reads the line's JSON and checks that the store can hold it, then
// custom_id, method and url.
func (v *validation) parse(no int, line []byte, tooLong bool, req *requestLine) *wire.Error {
	if tooLong {
		return wire.Invalid("", client.CodeLineTooLong, "the line is longer than %d bytes.", maxLineBytes)
	}
	// Checked before decoding, which would replace bytes that are not
	// UTF-8 and take what Postgres refuses.
	unstorable := jsontext.Unstorable(line)
	if unstorable == nil {
		unstorable = jsontext.Structure(line, jsontext.Names(req)...)
	}
	if unstorable != nil && unstorable.Raw {
		return wire.Invalid("", unstorable.Code, "the line holds %s at byte %d, which cannot be stored; a batch input file must be UTF-8 text.",
			unstorable.What, unstorable.Offset+1)
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return decodeError(err)
	}
	if dec.More() {
		return wire.Invalid("", client.CodeInvalidJSONLine, "the line holds more than one JSON value.")
	}
	if unstorable != nil {
		le := unstorableField(line, unstorable)
		if le.Param == "custom_id" {
			req.CustomID = nil // neither stored nor echoed
		}
		return le
	}
	switch {
	case req.CustomID == nil || *req.CustomID == "":
		return wire.Invalid("custom_id", client.CodeMissingCustomID, "custom_id is required: a non-empty string, unique within the file.")
	case len(*req.CustomID) > 512:
		return wire.Invalid("custom_id", client.CodeInvalidCustomID, "custom_id must be at most 512 bytes.")
	}
	// 128 bits of the id's hash: the check costs the same whatever the ids' length.
	sum := sha256.Sum256([]byte(*req.CustomID))
	key := [16]byte(sum[:16])
	if first, dup := v.seen[key]; dup {
		return wire.Invalid("custom_id", client.CodeDuplicateCustomID, "custom_id '%s' is already used on line %d; custom ids must be unique within a file.", *req.CustomID, first)
	}
	v.seen[key] = no
	switch {
	case req.Method != "POST":
		return wire.Invalid("method", client.CodeInvalidMethod, "method must be POST, got '%.20s'.", req.Method)
	case req.URL != v.b.Endpoint:
		return wire.Invalid("url", client.CodeInvalidURL, "url '%.100s' is not the batch's endpoint '%s'; every line of a batch goes to its endpoint.", req.URL, v.b.Endpoint)
	case len(bytes.TrimSpace(req.Body)) == 0 || bytes.Equal(bytes.TrimSpace(req.Body), []byte("null")):
		return wire.Invalid("body", client.CodeMissingBody, "body is required: the request to send to %s.", v.b.Endpoint)
	}
	return nil
}

// unstorableField is the refusal of a decoded line holding p, something
// Postgres cannot store, naming the field (custom_id, body, method, url)
// that holds it: a request is refused rather than sent other than written.
func unstorableField(line []byte, p *jsontext.Problem) *wire.Error {
	field := jsontext.Field(p.Param(line))
	if field != "" && p.Member != field {
		return wire.Invalid(field, p.Code, "%s holds %s, %s.", field, p.What, p.Why())
	}
	return wire.Invalid(field, p.Code, "the line holds %s, %s.", p.What, p.Why())
}

// admit asks admission whether the body can ever run, and whether its
// worst case fits the tenant's whole daily budget, and fills job with what
// it admitted; err is one it could not answer now (the store it asks of
// follow-ups).
func (v *validation) admit(ctx context.Context, body json.RawMessage, job *store.JobInsertParams) (*wire.Error, error) {
	admitted, err := v.s.Admission.Admit(ctx, v.policy, v.tier, v.acct, v.b.Endpoint, body)
	var refusal *wire.Error
	if errors.As(err, &refusal) {
		return wire.Invalid(refusal.ParamIn("body"), refusal.Code, "%s", refusal.Message), nil
	}
	if err != nil {
		return nil, err
	}
	admitted.Fill(job)
	switch {
	case v.tier.BatchOffload != config.BatchOffloadAlways: // any line may run on llmq's own path
	case !offload.Offloads(v.policy, v.tier, job.Model):
		return wire.Invalid("body.model", client.CodeBatchOffloadUnavailable, "model %q has no provider Batch API, and this tier runs batches only there (batch_offload: always).", job.Model), nil
	case !offload.Plain(&admitted.Shape):
		return wire.Invalid("body", client.CodeBatchOffloadUnavailable, "this request continues a stored conversation, asks for a service tier, names built-in tools or holds content llmq cannot count, which llmq bounds call by call and never sends to a provider's Batch API; this tier runs batches only there (batch_offload: always)."), nil
	}
	return nil, nil
}

// decodeError names what is wrong with a line's JSON.
func decodeError(err error) *wire.Error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return wire.Invalid("", client.CodeInvalidJSONLine, "the line is not valid JSON (at byte %d): %v.", syn.Offset, syn)
	case errors.As(err, &typ) && typ.Field == "":
		return wire.Invalid("", client.CodeInvalidJSONLine, "the line must be a JSON object, got %s.", typ.Value)
	case errors.As(err, &typ):
		want := "a string"
		if typ.Field == "body" {
			want = "a JSON object"
		}
		return wire.Invalid(typ.Field, client.CodeInvalidValue, "%s must be %s, got %s.", typ.Field, want, typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return wire.Invalid("", client.CodeInvalidJSONLine, "the line is truncated JSON.")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return wire.Invalid(name, client.CodeUnknownField, "unknown field '%.40s'; a line has custom_id, method, url and body.", name)
	}
	return wire.Invalid("", client.CodeInvalidJSONLine, "the line is not valid JSON: %v.", err)
}

// lineReader yields the lines of a file with their 1-based numbers. A line
// longer than max is reported as too long and skipped without being held.
type lineReader struct {
	br  *bufio.Reader
	max int
	no  int
	buf []byte
}

// next returns the next line without its line ending, or io.EOF.
func (lr *lineReader) next() (no int, line []byte, tooLong bool, err error) {
	lr.buf = lr.buf[:0]
	read := false
	for {
		chunk, err := lr.br.ReadSlice('\n')
		read = read || len(chunk) > 0
		if !tooLong {
			if len(lr.buf)+len(chunk) > lr.max+2 { // room for "\r\n"
				tooLong, lr.buf = true, lr.buf[:0]
			} else {
				lr.buf = append(lr.buf, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil && (!read || !errors.Is(err, io.EOF)) {
			return 0, nil, false, err // io.EOF once every line was read
		}
		break
	}
	lr.no++
	line = bytes.TrimSuffix(bytes.TrimSuffix(lr.buf, []byte("\n")), []byte("\r"))
	if !tooLong && len(line) > lr.max {
		tooLong, line = true, nil
	}
	return lr.no, line, tooLong, nil
}
