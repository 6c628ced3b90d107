package client

// Code is the "code" of an error object: what went wrong, for a client to
// match on (e.Code == client.CodeBudgetExhausted). The README's "Error codes"
// table lists each with its HTTP status. A provider's own codes pass through
// as they are, so a Code may also hold one not listed here.
type Code string

// Authentication, the API's own limits and unknown addresses.
const (
	CodeInvalidAPIKey       Code = "invalid_api_key"
	CodeInvalidAdminToken   Code = "invalid_admin_token"
	CodeCrossSiteRequest    Code = "cross_site_request"
	CodeTooManyAuthFailures Code = "too_many_auth_failures"
	CodeRateLimitExceeded   Code = "rate_limit_exceeded"
	CodeNotFound            Code = "not_found"
	CodeUnknownURL          Code = "unknown_url"
)

// A request that is not well formed.
const (
	CodeInvalidJSON              Code = "invalid_json"
	CodeInvalidType              Code = "invalid_type"
	CodeInvalidValue             Code = "invalid_value"
	CodeUnknownField             Code = "unknown_field"
	CodeMissingRequiredParameter Code = "missing_required_parameter"
	CodeMissingBody              Code = "missing_body"
	CodeInvalidEndpoint          Code = "invalid_endpoint"
	CodeInvalidURL               Code = "invalid_url"
	CodeWebhookURLInternal       Code = "webhook_url_internal"
	CodeInvalidMetadata          Code = "invalid_metadata"
	CodePriorityNotAllowed       Code = "priority_not_allowed"
	CodeUnknownTier              Code = "unknown_tier"
	CodeUnsupportedMediaType     Code = "unsupported_media_type"
	CodeInvalidContentType       Code = "invalid_content_type"
	CodeInvalidMultipart         Code = "invalid_multipart"
	CodeRequestTooLarge          Code = "request_too_large"
	CodeRequestTimeout           Code = "request_timeout"
	CodeInvalidHeader            Code = "invalid_header"
	CodeInvalidEncoding          Code = "invalid_encoding"
	CodeNumberOutOfRange         Code = "number_out_of_range"
	CodeDuplicateKey             Code = "duplicate_key"
	CodeTooDeep                  Code = "too_deep"
	CodeCaseVariant              Code = "case_variant"
)

// A request that can never run as sent.
const (
	CodeInvalidRequest       Code = "invalid_request"
	CodeModelNotFound        Code = "model_not_found"
	CodeModelNotSupported    Code = "model_not_supported"
	CodeFallbackNotAllowed   Code = "fallback_not_allowed"
	CodeUnsupportedValue     Code = "unsupported_value"
	CodeUnsupportedParameter Code = "unsupported_parameter"
	CodeOutputLimitRequired  Code = "output_limit_required"
	CodeTokensExceedCapacity Code = "tokens_exceed_capacity"
	CodeBudgetTooSmall       Code = "budget_too_small"
)

// Budgets.
const (
	CodeBudgetExhausted   Code = "budget_exhausted"
	CodeBudgetHeld        Code = "budget_held"
	CodeInsufficientQuota Code = "insufficient_quota"
	CodeBudgetsDisabled   Code = "budgets_disabled"
)

// Jobs, idempotency and synchronous requests.
const (
	CodeJobFinished          Code = "job_finished"
	CodeIdempotencyKeyReused Code = "idempotency_key_reused"
	CodeRequestInProgress    Code = "request_in_progress"
	CodeRequestCancelled     Code = "request_cancelled"
	CodeRequestFailed        Code = "request_failed"
	CodeNotFinished          Code = "not_finished"
	CodeSyncAbandoned        Code = "sync_abandoned"
	CodeWorkerLost           Code = "worker_lost"
)

// Files and batches.
const (
	CodeInvalidFilePurpose      Code = "invalid_file_purpose"
	CodeFileTooLarge            Code = "file_too_large"
	CodeTooManyLines            Code = "too_many_lines"
	CodeEmptyFile               Code = "empty_file"
	CodeFileInUse               Code = "file_in_use"
	CodeBatchNotCancellable     Code = "batch_not_cancellable"
	CodeTierNotFound            Code = "tier_not_found"
	CodeValidationFailed        Code = "validation_failed"
	CodeMoreErrors              Code = "more_errors"
	CodeLineTooLong             Code = "line_too_long"
	CodeLineUnstorable          Code = "line_unstorable"
	CodeInvalidJSONLine         Code = "invalid_json_line"
	CodeMissingCustomID         Code = "missing_custom_id"
	CodeInvalidCustomID         Code = "invalid_custom_id"
	CodeDuplicateCustomID       Code = "duplicate_custom_id"
	CodeInvalidMethod           Code = "invalid_method"
	CodeBatchOffloadUnavailable Code = "batch_offload_unavailable"
	CodeBatchExpired            Code = "batch_expired"
	CodeBatchCancelled          Code = "batch_cancelled"
	CodeBatchFailed             Code = "batch_failed"
)

// Providers and llmq's own faults.
const (
	CodeProviderNotFound           Code = "provider_not_found"
	CodeProviderResponseTooLarge   Code = "provider_response_too_large"
	CodeProviderResponseUnreadable Code = "provider_response_unreadable"
	CodeProviderResponseInvalid    Code = "provider_response_invalid"
	CodeProviderStreamFailed       Code = "provider_stream_failed"
	CodeProviderUsageInvalid       Code = "provider_usage_invalid"
	// CodeContextLengthExceeded is the provider's: llmq reads it to try a
	// fallback with a longer context.
	CodeContextLengthExceeded Code = "context_length_exceeded"
	CodeInternalError         Code = "internal_error"
	// CodeServerError is a failed background response's error code when its
	// job's error has none.
	CodeServerError           Code = "server_error"
	CodeDatabaseUnavailable   Code = "database_unavailable"
	CodeQueueStoreUnavailable Code = "queue_store_unavailable"
	CodeNotReady              Code = "not_ready"
)
