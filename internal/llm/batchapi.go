package llm

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime/multipart"
	"net/http"
	"net/url"
	"strings"
	"time"

	openai "github.com/sashabaranov/go-openai"

	"github.com/llmq/llmq/client"
)

// BatchAPI is a provider's Files and Batches API, which the offloader uses.
// A Provider offers it when it implements this interface. Every method
// answers an *Error on failure, classified like a call's.
type BatchAPI interface {
	// UploadBatchFile uploads content (JSONL) as a file of purpose "batch".
	UploadBatchFile(ctx context.Context, name string, content io.Reader) (string, error)
	// FindBatchFile returns the id of the newest file of purpose "batch"
	// named name, so a crash after an upload does not upload again.
	FindBatchFile(ctx context.Context, name string) (id string, found bool, err error)
	// CreateBatch creates a provider batch with a 24h window.
	CreateBatch(ctx context.Context, fileID, endpoint string, metadata map[string]string) (*ProviderBatch, error)
	// FindBatch returns the newest provider batch whose metadata holds
	// key=value among those created at or after since.
	FindBatch(ctx context.Context, key, value string, since time.Time) (*ProviderBatch, bool, error)
	GetBatch(ctx context.Context, id string) (*ProviderBatch, error)
	CancelBatch(ctx context.Context, id string) (*ProviderBatch, error)
	// BatchFileContent streams the content of file id; the caller closes it.
	BatchFileContent(ctx context.Context, id string) (io.ReadCloser, error)
}

// The statuses of a provider batch.
const (
	BatchValidating = "validating"
	BatchFailed     = "failed"
	BatchInProgress = "in_progress"
	BatchFinalizing = "finalizing"
	BatchCompleted  = "completed"
	BatchExpired    = "expired"
	BatchCancelling = "cancelling"
	BatchCancelled  = "cancelled"
)

// ProviderBatch is a provider's batch object, the fields llmq reads.
type ProviderBatch struct {
	ID            string                    `json:"id"`
	Status        string                    `json:"status"`
	InputFileID   string                    `json:"input_file_id"`
	OutputFileID  string                    `json:"output_file_id"`
	ErrorFileID   string                    `json:"error_file_id"`
	CreatedAt     int64                     `json:"created_at"`
	Metadata      map[string]string         `json:"metadata"`
	RequestCounts client.BatchRequestCounts `json:"request_counts"`
	Errors        *struct {
		Data []struct {
			Code string `json:"code"`
		} `json:"data"`
	} `json:"errors"`
}

// Ended reports whether the batch will change no more.
func (b *ProviderBatch) Ended() bool {
	return b.Status == BatchCompleted || b.Status == BatchFailed || b.Status == BatchExpired || b.Status == BatchCancelled
}

// ErrorCodes are the codes of the batch's errors.
func (b *ProviderBatch) ErrorCodes() []string {
	if b.Errors == nil {
		return nil
	}
	out := make([]string, len(b.Errors.Data))
	for i, e := range b.Errors.Data {
		out[i] = e.Code
	}
	return out
}

// maxObjectBytes bounds a file or batch object, or a page of them.
const maxObjectBytes = 4 << 20

// apiURL is the URL of path ("/files"); Azure's versioned API puts it under
// /openai with the api-version.
func (p *openAIProvider) apiURL(path string, query url.Values) string {
	if p.azure && p.apiVersion != "" {
		if query == nil {
			query = url.Values{}
		}
		query.Set("api-version", p.apiVersion)
		path = "/openai" + path
	}
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	return p.baseURL + path
}

// send makes one request and returns the 2xx answer (for the caller to read
// and close) or an *Error. The provider's timeout does not bound it: an
// upload streams.
func (p *openAIProvider) send(ctx context.Context, method, path string, query url.Values, header http.Header, body io.Reader) (*http.Response, error) {
	hr, err := http.NewRequestWithContext(ctx, method, p.apiURL(path, query), body)
	if err != nil {
		return nil, p.refuse(err)
	}
	maps.Copy(hr.Header, header)
	switch {
	case p.apiKey == "":
	case p.azure:
		hr.Header.Set(openai.AzureAPIKeyHeader, p.apiKey)
	default:
		hr.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	resp, err := p.http.Do(hr)
	if err != nil {
		return nil, p.noAnswer(ctx, err, 0)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, p.errorAnswer(resp)
	}
	return resp, nil
}

func (p *openAIProvider) object(ctx context.Context, method, path string, query url.Values, in any, out any) error {
	ctx, cancel := context.WithTimeoutCause(ctx, p.timeout, errTimeout)
	defer cancel()
	var body io.Reader
	var header http.Header
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return p.refuse(err)
		}
		body, header = strings.NewReader(string(b)), jsonHeader()
	}
	resp, err := p.send(ctx, method, path, query, header, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return p.decodeObject(resp, out)
}

func (p *openAIProvider) decodeObject(resp *http.Response, out any) error {
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxObjectBytes+1))
	if err == nil && len(b) > maxObjectBytes {
		err = fmt.Errorf("larger than %d bytes", maxObjectBytes)
	}
	if err == nil {
		err = unmarshal(b, out)
	}
	if err != nil {
		return p.answered(resp).serverError(ClassRetryable, client.CodeProviderResponseUnreadable,
			"The provider's answer could not be read: "+p.scrub(err.Error()))
	}
	return nil
}

func (p *openAIProvider) UploadBatchFile(ctx context.Context, name string, content io.Reader) (string, error) {
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		err := mw.WriteField("purpose", "batch")
		if err == nil {
			var part io.Writer
			if part, err = mw.CreateFormFile("file", name); err == nil {
				if _, err = io.Copy(part, content); err == nil {
					err = mw.Close()
				}
			}
		}
		pw.CloseWithError(err)
	}()
	resp, err := p.send(ctx, http.MethodPost, "/files", nil, http.Header{"Content-Type": {mw.FormDataContentType()}}, pr)
	pr.Close() // ends the writer if the request stopped reading
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var f struct {
		ID string `json:"id"`
	}
	if err := p.decodeObject(resp, &f); err != nil {
		return "", err
	}
	if f.ID == "" {
		return "", p.answered(resp).serverError(ClassPermanent, client.CodeProviderResponseInvalid,
			"The provider answered a file object without an id.")
	}
	return f.ID, nil
}

func (p *openAIProvider) FindBatchFile(ctx context.Context, name string) (string, bool, error) {
	var page struct {
		Data []struct {
			ID        string `json:"id"`
			Filename  string `json:"filename"`
			CreatedAt int64  `json:"created_at"`
		} `json:"data"`
	}
	q := url.Values{"purpose": {"batch"}, "order": {"desc"}, "limit": {"10000"}}
	if err := p.object(ctx, http.MethodGet, "/files", q, nil, &page); err != nil {
		return "", false, err
	}
	best, newest := "", int64(-1)
	for _, f := range page.Data {
		if f.Filename == name && f.CreatedAt > newest {
			best, newest = f.ID, f.CreatedAt
		}
	}
	return best, best != "", nil
}

func (p *openAIProvider) CreateBatch(ctx context.Context, fileID, endpoint string, metadata map[string]string) (*ProviderBatch, error) {
	in := map[string]any{"input_file_id": fileID, "endpoint": endpoint, "completion_window": "24h", "metadata": metadata}
	return p.batch(ctx, http.MethodPost, "/batches", in)
}

func (p *openAIProvider) batch(ctx context.Context, method, path string, in any) (*ProviderBatch, error) {
	var b ProviderBatch
	if err := p.object(ctx, method, path, nil, in, &b); err != nil {
		return nil, err
	}
	if b.ID == "" || b.Status == "" {
		return nil, (&Error{Provider: p.name}).serverError(ClassPermanent, client.CodeProviderResponseInvalid,
			"The provider answered a batch object without an id or status.")
	}
	return &b, nil
}

func (p *openAIProvider) FindBatch(ctx context.Context, key, value string, since time.Time) (*ProviderBatch, bool, error) {
	after := ""
	for {
		q := url.Values{"limit": {"100"}}
		if after != "" {
			q.Set("after", after)
		}
		var page struct {
			Data    []ProviderBatch `json:"data"`
			HasMore bool            `json:"has_more"`
		}
		if err := p.object(ctx, http.MethodGet, "/batches", q, nil, &page); err != nil {
			return nil, false, err
		}
		for i := range page.Data {
			b := &page.Data[i]
			if b.Metadata[key] == value && b.ID != "" && b.CreatedAt >= since.Unix() {
				return b, true, nil
			}
		}
		// Newest first: a page ending before since ends the search.
		if !page.HasMore || len(page.Data) == 0 || page.Data[len(page.Data)-1].CreatedAt < since.Unix() {
			return nil, false, nil
		}
		after = page.Data[len(page.Data)-1].ID
	}
}

func (p *openAIProvider) GetBatch(ctx context.Context, id string) (*ProviderBatch, error) {
	return p.batch(ctx, http.MethodGet, "/batches/"+url.PathEscape(id), nil)
}

func (p *openAIProvider) CancelBatch(ctx context.Context, id string) (*ProviderBatch, error) {
	return p.batch(ctx, http.MethodPost, "/batches/"+url.PathEscape(id)+"/cancel", nil)
}

func (p *openAIProvider) BatchFileContent(ctx context.Context, id string) (io.ReadCloser, error) {
	resp, err := p.send(ctx, http.MethodGet, "/files/"+url.PathEscape(id)+"/content", nil, nil, nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// BatchLine is one line of a provider batch's output or error file: OpenAI's
// shape, which llmq's own batches write too.
type BatchLine = client.BatchResult

// BatchInputLine is req as a line of a provider batch's input file (no
// newline), under customID.
func BatchInputLine(customID string, req Request) ([]byte, error) {
	body, _, err := wireBody(req)
	if err != nil {
		return nil, err
	}
	line := client.BatchRequest{CustomID: customID, Method: http.MethodPost, URL: req.Endpoint, Body: body}
	return json.Marshal(line)
}
