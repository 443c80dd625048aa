package slowpath

import "github.com/valyala/fasthttp"

// apiError is one kind of answer the router makes itself: its HTTP status,
// the reason counted in rejected_total, and the OpenAI error type and code
// ("" is JSON null). Call sites pick an entry and pass the message and the
// param; the README's Errors table lists the same situations.
type apiError struct {
	status int
	reason string
	typ    string
	code   string
}

// The router's own errors, one entry each.
var (
	// The request itself.
	apiMalformedHTTP   = apiError{fasthttp.StatusBadRequest, "malformed_http", errTypeInvalid, ""}
	apiReadTimeout     = apiError{fasthttp.StatusRequestTimeout, "timeout", errTypeInvalid, ""}
	apiHeadersTooLarge = apiError{fasthttp.StatusRequestHeaderFieldsTooLarge, "headers_too_large", errTypeInvalid, "headers_too_large"}
	apiTooLarge        = apiError{fasthttp.StatusRequestEntityTooLarge, "too_large", errTypeInvalid, "request_too_large"}
	apiUnknownPath     = apiError{fasthttp.StatusNotFound, "unknown_path", errTypeInvalid, "unknown_url"}
	apiMethod          = apiError{fasthttp.StatusMethodNotAllowed, "method", errTypeInvalid, "method_not_allowed"}
	apiContentType     = apiError{fasthttp.StatusBadRequest, "content_type", errTypeInvalid, ""}
	apiEmptyBody       = apiError{fasthttp.StatusBadRequest, "empty_body", errTypeInvalid, ""}
	apiBadJSON         = apiError{fasthttp.StatusBadRequest, "bad_json", errTypeInvalid, ""}
	apiNoModel         = apiError{fasthttp.StatusBadRequest, "no_model", errTypeInvalid, ""}
	apiBadRequest      = apiError{fasthttp.StatusBadRequest, "bad_request", errTypeInvalid, ""}
	apiModelNotFound   = apiError{fasthttp.StatusNotFound, "model_not_found", errTypeInvalid, "model_not_found"}

	// Tenancy.
	apiInvalidKey   = apiError{fasthttp.StatusUnauthorized, "invalid_api_key", errTypeInvalid, "invalid_api_key"}
	apiBadPriority  = apiError{fasthttp.StatusBadRequest, "bad_priority", errTypeInvalid, ""}
	apiTenantBudget = apiError{fasthttp.StatusTooManyRequests, "tenant_budget", errTypeRateLimit, "rate_limit_exceeded"}

	// Capacity.
	apiTotalLimit   = apiError{fasthttp.StatusTooManyRequests, "total_limit", errTypeRateLimit, "rate_limit_exceeded"}
	apiReplicaLimit = apiError{fasthttp.StatusTooManyRequests, "replica_limit", errTypeRateLimit, "rate_limit_exceeded"}
	apiNoReplica    = apiError{fasthttp.StatusServiceUnavailable, "no_replica", errTypeUnavailable, "no_replica_available"}

	// Responses API state held by one replica.
	apiPrevGone         = apiError{fasthttp.StatusNotFound, "previous_response_gone", errTypeInvalid, "previous_response_not_found"}
	apiResponseGone     = apiError{fasthttp.StatusNotFound, "previous_response_gone", errTypeInvalid, "response_not_found"}
	apiPrevModel        = apiError{fasthttp.StatusBadRequest, "previous_response_model", errTypeInvalid, ""}
	apiPrevUnavailable  = apiError{fasthttp.StatusServiceUnavailable, "previous_response_unavailable", errTypeUnavailable, "replica_unavailable"}
	apiResponseNotFound = apiError{fasthttp.StatusNotFound, "response_not_found", errTypeInvalid, "response_not_found"}

	// The upstream attempt.
	apiClientGone       = apiError{statusClientClosed, "client_gone", errTypeInvalid, ""}
	apiResponseTooLarge = apiError{fasthttp.StatusBadGateway, "response_too_large", errTypeUpstream, "response_too_large"}
	apiUpstreamTimeout  = apiError{fasthttp.StatusGatewayTimeout, "upstream_timeout", errTypeUpstream, "upstream_timeout"}
	apiUpstreamFailed   = apiError{fasthttp.StatusBadGateway, "upstream_failed", errTypeUpstream, "upstream_error"}

	// The router itself.
	apiPanic = apiError{fasthttp.StatusInternalServerError, "panic", "internal_error", ""}
)

// withStatus is e answered with another status (an engine's retryable
// status passed on after the last attempt).
func (e apiError) withStatus(status int) apiError {
	e.status = status
	return e
}
