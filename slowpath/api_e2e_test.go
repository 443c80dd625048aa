package slowpath_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/slowpath"
)

var apiHTTP = &http.Client{Timeout: 20e9}

func apiDo(t *testing.T, method, url, ct, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := apiHTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func respParams(input, prev string) responses.ResponseNewParams {
	p := responses.ResponseNewParams{Model: e2eModel, MaxOutputTokens: openai.Int(6),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(input)}}
	if prev == "" {
		p.Instructions = openai.String(longSystem(40))
	} else {
		p.PreviousResponseID = openai.String(prev)
	}
	return p
}

// TestAPIResponsesPinned: the Responses API through warmpath with the
// official client, streamed and not; every previous_response_id turn lands
// on the replica that stored the previous response (enginesim, as vLLM,
// answers 404 for an id it does not hold, so a misrouted turn fails), and
// the engine's cached tokens come back to the router from both shapes.
// Round-robin routing: without the pin each turn would go to another
// replica.
func TestAPIResponsesPinned(t *testing.T) {
	engines := startEngines(t, 3, nil)
	_, c, obs, _ := startAPI(t, engines, func(c *slowpath.Config) { c.Routing.Policy = "round-robin" })
	r, err := c.Responses.New(ctxT(t), respParams("first question", ""))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.ID, "resp_") || r.OutputText() == "" || r.Usage.InputTokens == 0 {
		t.Fatalf("response %+v", r)
	}
	prev := r.ID
	for i := range 6 {
		if i%2 == 0 {
			r, err := c.Responses.New(ctxT(t), respParams(fmt.Sprintf("follow-up %d", i), prev))
			if err != nil {
				t.Fatalf("turn %d: %v", i, err)
			}
			if r.Usage.InputTokensDetails.CachedTokens == 0 {
				t.Fatalf("turn %d: no cached tokens on the pinned replica: %+v", i, r.Usage)
			}
			prev = r.ID
			continue
		}
		st := c.Responses.NewStreaming(ctxT(t), respParams(fmt.Sprintf("streamed follow-up %d", i), prev))
		var deltas strings.Builder
		var types []string
		var done responses.Response
		for st.Next() {
			ev := st.Current()
			types = append(types, ev.Type)
			switch ev.Type {
			case "response.output_text.delta":
				deltas.WriteString(ev.Delta)
			case "response.completed":
				done = ev.Response
			}
		}
		if err := st.Err(); err != nil {
			t.Fatalf("turn %d stream: %v", i, err)
		}
		if types[0] != "response.created" || types[len(types)-1] != "response.completed" || deltas.Len() == 0 ||
			done.OutputText() != deltas.String() || done.Usage.InputTokensDetails.CachedTokens == 0 {
			t.Fatalf("turn %d stream: events %v text %q completed %+v", i, types, deltas.String(), done)
		}
		prev = done.ID
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for i, rep := range obs.reps {
		if rep != obs.reps[0] {
			t.Fatalf("turn %d went to %s, the conversation is on %s", i, rep, obs.reps[0])
		}
		if i > 0 && obs.got[i] <= 0 {
			t.Fatalf("turn %d: router read cached tokens %d", i, obs.got[i])
		}
		if obs.prompt[i] <= 0 { // streamed turns: from response.completed's usage
			t.Fatalf("turn %d: router read input tokens %d", i, obs.prompt[i])
		}
	}
	if len(obs.reps) != 7 {
		t.Fatalf("%d routed, want 7", len(obs.reps))
	}
}

// TestAPIResponsesErrors: the pinning failures and the Responses errors a
// client sees, each in the OpenAI error shape.
func TestAPIResponsesErrors(t *testing.T) {
	engines := startEngines(t, 2, func(c *enginesim.Config) { c.EnableAdmin = true })
	s, c, _, base := startAPI(t, engines, nil)
	r, err := c.Responses.New(ctxT(t), respParams("q", ""))
	if err != nil {
		t.Fatal(err)
	}
	// GET /v1/responses/{id} goes to the holder; an unknown id is a 404.
	st, _, body := apiDo(t, "GET", base+"/v1/responses/"+r.ID, "", "")
	if st != 200 || !strings.Contains(body, `"id":"`+r.ID+`"`) {
		t.Fatalf("retrieve: %d %s", st, body)
	}
	st, _, body = apiDo(t, "GET", base+"/v1/responses/resp_nope", "", "")
	if st != 404 || body != `{"error":{"message":"Response with id 'resp_nope' not found.","type":"invalid_request_error","param":"response_id","code":"response_not_found"}}` {
		t.Fatalf("unknown retrieve: %d %s", st, body)
	}
	// An id the router does not know is routed; the engine's own 404 passes through.
	_, err = c.Responses.New(ctxT(t), respParams("q", "resp_unknown"))
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Param != "response_id" {
		t.Fatalf("unknown previous id: %v", err)
	}
	// Bad JSON says where.
	st, _, body = apiDo(t, "POST", base+"/v1/responses", "application/json", `{"model":"sim-llama","input":"x"} {}`)
	if st != 400 || !strings.Contains(body, "trailing data after the JSON object at line 1, column 35 (byte offset 34)") {
		t.Fatalf("trailing data: %d %s", st, body)
	}
	// The holder unhealthy: 503; removed from the pool: 404.
	holder := holderOf(t, engines, r.ID)
	holder.SetFaults(enginesim.Faults{Unhealthy: true})
	apiWait(t, "holder unhealthy", func() bool {
		for _, rs := range s.Replicas() {
			if rs.Name == holder.Addr() {
				return !rs.Healthy
			}
		}
		return false
	})
	_, err = c.Responses.New(ctxT(t), respParams("q2", r.ID))
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.Code != "replica_unavailable" || apiErr.Param != "previous_response_id" {
		t.Fatalf("holder unhealthy: %v", err)
	}
	var keep []slowpath.ReplicaConfig
	for _, en := range engines {
		if en != holder {
			keep = append(keep, slowpath.ReplicaConfig{Address: en.Addr(), Models: []string{e2eModel}})
		}
	}
	if err := s.ApplyReplicas(keep); err != nil {
		t.Fatal(err)
	}
	_, err = c.Responses.New(ctxT(t), respParams("q3", r.ID))
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "previous_response_not_found" {
		t.Fatalf("holder removed: %v", err)
	}
	// A stream the engine breaks mid-way ends with the router's error event.
	for _, en := range engines {
		en.SetFaults(enginesim.Faults{CloseAfterChunks: 2})
	}
	p := respParams("break me", "")
	p.MaxOutputTokens = openai.Int(12)
	stream := c.Responses.NewStreaming(ctxT(t), p)
	var deltas int
	for stream.Next() {
		if stream.Current().Type == "response.output_text.delta" {
			deltas++
		}
	}
	if err := stream.Err(); err == nil || !strings.Contains(err.Error(), "upstream replica failed mid-stream") || deltas != 2 {
		t.Fatalf("broken stream: %d deltas, err %v", deltas, err)
	}
}

func holderOf(t *testing.T, engines []*enginesim.Server, id string) *enginesim.Server {
	t.Helper()
	for _, en := range engines {
		st, _, _ := apiDo(t, "GET", "http://"+en.Addr()+"/v1/responses/"+id, "", "")
		if st == 200 {
			return en
		}
	}
	t.Fatalf("no engine holds %s", id)
	return nil
}

// startAPI is startE2E that also returns the router's base URL. Its
// health checks (and with them the engine lookups and model-card fetches,
// bounded by health.timeout) get 1s: a loaded machine under -race must not
// eject a healthy engine or miss a lookup.
func startAPI(t *testing.T, engines []*enginesim.Server, mutate func(*slowpath.Config)) (*slowpath.Server, openai.Client, *routed, string) {
	t.Helper()
	cfg := e2eConfig(engines)
	cfg.Health.Interval, cfg.Health.Timeout = time.Second, time.Second
	if mutate != nil {
		mutate(&cfg)
	}
	s, url, obs := startObserved(t, cfg)
	return s, testOpenAI(url), obs, url
}

// apiWait polls cond (bounded: 2000 polls of 5ms) until it holds.
func apiWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestAPIPassthrough: each pass-through endpoint through warmpath to
// enginesim (vLLM's shapes), the model list with the engines' fields, and
// the errors of a bad body.
func TestAPIPassthrough(t *testing.T) {
	engines := startEngines(t, 2, func(c *enginesim.Config) {
		c.LoRAModules = []string{"sql-lora=/adapters/sql"}
		c.MaxModelLen = 4096
	})
	_, _, obs, base := startAPI(t, engines, func(c *slowpath.Config) {
		c.Limits.MaxBodyBytes = 1 << 20
		for i := range c.Replicas {
			c.Replicas[i].Models = append(c.Replicas[i].Models, "sql-lora")
		}
	})
	const j = "application/json"
	tests := []struct {
		name, method, path, ct, body string
		status                       int
		want                         string // substring of the answer
	}{
		{"tokenize", "POST", "/tokenize", j, `{"model":"sim-llama","prompt":"abcdefgh"}`, 200, `"tokens":[1684234849,1751606885]`},
		{"tokenize without model (one base model and its adapter: ambiguous)", "POST", "/tokenize", j, `{"prompt":"abcd"}`, 400, `you must provide a model parameter`},
		{"detokenize", "POST", "/detokenize", j, `{"model":"sim-llama","tokens":[1684234849,1751606885]}`, 200, `{"prompt":"abcdefgh"}`},
		{"rerank v1", "POST", "/v1/rerank", j, `{"model":"sim-llama","query":"red fox","documents":["a blue whale","the red fox jumps"]}`, 200, `"results":[{"index":1,"document":{"text":"the red fox jumps"},"relevance_score":1}`},
		{"rerank", "POST", "/rerank", j, `{"model":"sim-llama","query":"x","documents":["x"]}`, 200, `"relevance_score":1`},
		{"rerank v2", "POST", "/v2/rerank", j, `{"model":"sql-lora","query":"x","documents":["y"]}`, 200, `"model":"sql-lora"`},
		{"score", "POST", "/v1/score", j, `{"model":"sim-llama","text_1":"a b","text_2":["a","c"]}`, 200, `"data":[{"index":0,"object":"score","score":0.5},{"index":1,"object":"score","score":0}]`},
		{"score unversioned", "POST", "/score", j, `{"model":"sim-llama","text_1":"a","text_2":"a"}`, 200, `"score":1`},
		{"pooling", "POST", "/pooling", j, `{"model":"sim-llama","input":["one","two"]}`, 200, `"object":"pooling"`},
		{"version", "GET", "/version", "", "", 200, `{"version":"enginesim"}`},
		{"+json content type", "POST", "/tokenize", "application/vnd.api+json", `{"model":"sim-llama","prompt":"abcd"}`, 200, `"count":1`},
		{"unknown model", "POST", "/v1/rerank", j, `{"model":"nope","query":"x","documents":["x"]}`, 404, `"code":"model_not_found"`},
		{"engine's own 400 passes through", "POST", "/v1/rerank", j, `{"model":"sim-llama","documents":[]}`, 400, `query and a non-empty documents list are required`},
		{"model twice", "POST", "/v1/score", j, `{"model":"sim-llama","model":"sql-lora","text_1":"a","text_2":"a"}`, 400, `"param":"model"`},
		{"truncated", "POST", "/v1/score", j, "{\"model\":\"sim-llama\",\n\"text_1\":", 400, `the body is truncated: it ends at byte 31 (line 2, column 10) inside an unfinished value.`},
		{"not an object", "POST", "/pooling", j, `"x"`, 400, `the body is a JSON string, not an object.`},
		{"invalid character", "POST", "/v1/responses", j, "{\"model\":\"sim-llama\",\n  \"input\": x}", 400, `invalid character 'x' looking for beginning of value at line 2, column 12 (byte offset 33).`},
		{"GET on tokenize", "GET", "/tokenize", "", "", 405, `"code":"method_not_allowed"`},
		{"model card", "GET", "/v1/models/sql-lora", "", "", 200, `"id":"sql-lora","object":"model"`},
		{"unknown model card", "GET", "/v1/models/nope", "", "", 404, `"code":"model_not_found"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, _, body := apiDo(t, tc.method, base+tc.path, tc.ct, tc.body)
			if st != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("%d %s\nwant %d with %s", st, body, tc.status, tc.want)
			}
			if st >= 400 && !strings.HasPrefix(body, `{"error":{"message":`) {
				t.Fatalf("error not in the OpenAI shape: %s", body)
			}
		})
	}
	// The model list keeps the engines' fields.
	st, _, body := apiDo(t, "GET", base+"/v1/models", "", "")
	var list struct {
		Data []struct {
			ID string
		}
	}
	if err := json.Unmarshal([]byte(body), &list); st != 200 || err != nil || len(list.Data) != 2 {
		t.Fatalf("models %d %s %v", st, body, err)
	}
	if list.Data[0].ID != "sim-llama" || list.Data[1].ID != "sql-lora" {
		t.Fatalf("model ids: %s", body)
	}
	if !strings.Contains(body, `{"id":"sim-llama","object":"model","created":`) ||
		!strings.Contains(body, `"owned_by":"vllm","root":"sim-llama","parent":null,"max_model_len":4096`) ||
		!strings.Contains(body, `"owned_by":"vllm","root":"/adapters/sql","parent":"sim-llama","max_model_len":4096`) {
		t.Fatalf("model cards lost the engines' fields: %s", body)
	}
	if n := len(obs.counts()); n == 0 {
		t.Fatal("pass-through requests not observed")
	}
}

// multipartBody builds an audio upload: fields, then a file part of n bytes.
func multipartBody(t *testing.T, n int, fields ...string) (string, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		mw.WriteField(fields[i], fields[i+1])
	}
	fw, err := mw.CreateFormFile("file", "a.wav")
	if err != nil {
		t.Fatal(err)
	}
	fw.Write(bytes.Repeat([]byte{7}, n))
	mw.Close()
	return b.String(), mw.FormDataContentType()
}

// TestAPIAudio: multipart transcriptions and translations, the model read
// from the form, streamed and not; the whole file reaches the engine; over
// limits.max_body_bytes is a 413 before anything is forwarded.
func TestAPIAudio(t *testing.T) {
	engines := startEngines(t, 2, nil)
	_, _, _, base := startAPI(t, engines, func(c *slowpath.Config) { c.Limits.MaxBodyBytes = 1 << 20 })
	body, ct := multipartBody(t, 300_000, "model", e2eModel, "language", "en")
	st, _, got := apiDo(t, "POST", base+"/v1/audio/transcriptions", ct, body)
	if st != 200 || !strings.Contains(got, `"text":"300000 bytes of audio`) {
		t.Fatalf("transcription: %d %s", st, got)
	}
	body, ct = multipartBody(t, 1000, "stream", "true", "model", e2eModel)
	st, h, got := apiDo(t, "POST", base+"/v1/audio/translations", ct, body)
	if st != 200 || h.Get("Content-Type") != "text/event-stream" || !strings.Contains(got, `"object":"transcription.chunk"`) ||
		!strings.HasSuffix(got, "data: [DONE]\n\n") {
		t.Fatalf("streamed translation: %d %v %s", st, h, got)
	}
	served := engines[0].Served(e2eModel) + engines[1].Served(e2eModel)
	for _, tc := range []struct {
		name, ct, body string
		status         int
		want           string
	}{
		{"unknown model", ct, strings.Replace(body, e2eModel, "nope", 1), 404, `"code":"model_not_found"`},
		{"JSON instead of multipart", "application/json", `{"model":"sim-llama"}`, 400, `Content-Type must be multipart/form-data`},
		{"no boundary", "multipart/form-data", body, 400, `body is not a valid multipart/form-data body`},
		{"bad stream field", ct, strings.Replace(body, "true", "yes!", 1), 400, `"param":"stream"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _, got := apiDo(t, "POST", base+"/v1/audio/transcriptions", tc.ct, tc.body)
			if st != tc.status || !strings.Contains(got, tc.want) {
				t.Fatalf("%d %s, want %d %s", st, got, tc.status, tc.want)
			}
		})
	}
	// As curl does for a large upload: Expect: 100-continue, so the 413
	// comes before the body is sent.
	big, ct := multipartBody(t, 2<<20, "model", e2eModel)
	req, _ := http.NewRequest("POST", base+"/v1/audio/transcriptions", strings.NewReader(big))
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Expect", "100-continue")
	tr := &http.Transport{ExpectContinueTimeout: 5 * time.Second}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	st, got = resp.StatusCode, string(b)
	if st != 413 || !strings.Contains(got, `"code":"request_too_large"`) {
		t.Fatalf("oversized upload: %d %s", st, got)
	}
	if n := engines[0].Served(e2eModel) + engines[1].Served(e2eModel); n != served {
		t.Fatalf("refused uploads reached the engines: %d -> %d", served, n)
	}
}

// TestAPICORS: preflight answered for an allowed origin (403 otherwise),
// answers carry Access-Control-Allow-Origin, and without cors.allowed_origins
// an OPTIONS is a 405.
func TestAPICORS(t *testing.T) {
	engines := startEngines(t, 1, nil)
	_, _, _, base := startAPI(t, engines, func(c *slowpath.Config) {
		c.CORS.AllowedOrigins = []string{"https://app.example.com"}
	})
	st, h, body := apiDo(t, "OPTIONS", base+"/v1/chat/completions", "", "", "Origin", "https://app.example.com",
		"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization, content-type, x-stainless-os")
	if st != 204 || h.Get("Access-Control-Allow-Origin") != "https://app.example.com" || h.Get("Access-Control-Allow-Methods") != "GET, POST, OPTIONS" ||
		h.Get("Access-Control-Allow-Headers") != "authorization, content-type, x-stainless-os" || h.Get("Access-Control-Max-Age") != "600" || h.Get("Vary") != "Origin" {
		t.Fatalf("preflight: %d %v %s", st, h, body)
	}
	st, _, body = apiDo(t, "OPTIONS", base+"/v1/chat/completions", "", "", "Origin", "https://evil.example", "Access-Control-Request-Method", "POST")
	if st != 403 || !strings.Contains(body, `"code":"cors_origin_not_allowed"`) {
		t.Fatalf("disallowed preflight: %d %s", st, body)
	}
	chat := `{"model":"sim-llama","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`
	for _, stream := range []bool{false, true} {
		b := chat
		if stream {
			b = strings.Replace(chat, `"max_tokens"`, `"stream":true,"max_tokens"`, 1)
		}
		st, h, body = apiDo(t, "POST", base+"/v1/chat/completions", "application/json", b, "Origin", "https://app.example.com")
		if st != 200 || h.Get("Access-Control-Allow-Origin") != "https://app.example.com" || len(h.Values("Access-Control-Allow-Origin")) != 1 {
			t.Fatalf("stream=%v: %d %v %s", stream, st, h, body)
		}
	}
	st, h, _ = apiDo(t, "POST", base+"/v1/chat/completions", "application/json", chat, "Origin", "https://evil.example")
	if st != 200 || h.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("disallowed origin got %v", h)
	}
	// Errors carry it too (a browser could not read them otherwise).
	st, h, _ = apiDo(t, "POST", base+"/v1/chat/completions", "application/json", `{`, "Origin", "https://app.example.com")
	if st != 400 || h.Get("Access-Control-Allow-Origin") != "https://app.example.com" {
		t.Fatalf("error without CORS: %d %v", st, h)
	}
	_, _, _, plain := startAPI(t, engines, nil)
	st, _, body = apiDo(t, "OPTIONS", plain+"/v1/chat/completions", "", "", "Origin", "https://app.example.com", "Access-Control-Request-Method", "POST")
	if st != 405 {
		t.Fatalf("OPTIONS without cors: %d %s", st, body)
	}
}

// TestAPIResponsesEngineErrorEvent: an engine's own `error` event in a
// Responses stream (vLLM sends one when generation fails) reaches the
// client unchanged, and the model list keeps the engines' fields as the
// official client reads them.
func TestAPIResponsesEngineErrorEvent(t *testing.T) {
	engines := startEngines(t, 1, func(c *enginesim.Config) { c.TimeScale = 1 }) // ~7 ms per token: time to restart mid-stream
	_, c, _, _ := startAPI(t, engines, nil)
	p := respParams("a long answer please", "")
	p.MaxOutputTokens = openai.Int(400)
	st := c.Responses.NewStreaming(ctxT(t), p)
	var types []string
	var last responses.ResponseStreamEventUnion
	for st.Next() {
		ev := st.Current()
		types = append(types, ev.Type)
		last = ev
		if ev.Type == "response.output_text.delta" && len(types) == 5 {
			engines[0].Restart()
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("the engine's error event must arrive as an event, got %v (events %v)", err, types)
	}
	if last.Type != "error" || last.Code != "engine_error" || last.Message != "engine restarted" {
		t.Fatalf("last event %+v (events %v)", last, types)
	}
	ms, err := c.Models.List(ctxT(t))
	if err != nil || len(ms.Data) != 1 {
		t.Fatalf("models: %v %+v", err, ms)
	}
	m, err := c.Models.Get(ctxT(t), e2eModel)
	if err != nil || m.OwnedBy != "vllm" || m.JSON.ExtraFields["max_model_len"].Raw() != "131072" || m.JSON.ExtraFields["root"].Raw() != `"`+e2eModel+`"` {
		t.Fatalf("model card through the client: %v %+v %v", err, m, m.JSON.ExtraFields)
	}
	_, err = c.Models.Get(ctxT(t), "nope")
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
		t.Fatalf("unknown model card: %v", err)
	}
}

// TestAPIResponsesTenancy: with tenancy on, a Responses body gets the
// tenant's cache_salt like a chat body: the same instructions hit the cache
// within a tenant and not across tenants.
func TestAPIResponsesTenancy(t *testing.T) {
	engines := startEngines(t, 1, nil)
	_, _, _, base := startAPI(t, engines, func(c *slowpath.Config) { c.Tenancy.SaltFrom = slowpath.SaltFromAPIKey })
	client := func(key string) openai.Client {
		return openai.NewClient(option.WithBaseURL(base+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
	}
	cached := func(c openai.Client, q string) int64 {
		t.Helper()
		r, err := c.Responses.New(ctxT(t), respParams(q, ""))
		if err != nil {
			t.Fatal(err)
		}
		return r.Usage.InputTokensDetails.CachedTokens
	}
	a, b := client("sk-tenant-a"), client("sk-tenant-b")
	cached(a, "warm the cache")
	if n := cached(a, "same tenant"); n == 0 {
		t.Fatal("tenant A missed its own cached instructions")
	}
	if n := cached(b, "other tenant"); n != 0 {
		t.Fatalf("tenant B got %d cached tokens of tenant A's instructions", n)
	}
}

// TestAPIResponsesAcrossRouters: two router instances over the same
// engines (a fleet behind a balancer), round-robin, the turns of one
// conversation alternating between them: each router meets previous
// response ids it never saw, asks the engines which one holds it, and pins
// the turn there.
func TestAPIResponsesAcrossRouters(t *testing.T) {
	engines := startEngines(t, 3, nil)
	rr := func(c *slowpath.Config) { c.Routing.Policy = "round-robin" }
	_, a, _, _ := startAPI(t, engines, rr)
	_, b, obsB, _ := startAPI(t, engines, rr)
	r, err := a.Responses.New(ctxT(t), respParams("first", ""))
	if err != nil {
		t.Fatal(err)
	}
	prev := r.ID
	for i := range 6 {
		c := b
		if i%2 == 1 {
			c = a
		}
		r, err := c.Responses.New(ctxT(t), respParams(fmt.Sprintf("turn %d", i), prev))
		if err != nil {
			t.Fatalf("turn %d through router %c: %v", i, "ba"[i%2], err)
		}
		if r.Usage.InputTokensDetails.CachedTokens == 0 {
			t.Fatalf("turn %d: no cached tokens: not on the conversation's replica", i)
		}
		prev = r.ID
	}
	// The last turn went through a: b retrieves it from the engine that
	// holds it, then continues it.
	got, err := b.Responses.Get(ctxT(t), prev, responses.ResponseGetParams{})
	if err != nil || got.ID != prev || got.OutputText() == "" {
		t.Fatalf("retrieve through the other router: %v %+v", err, got)
	}
	if _, err := b.Responses.New(ctxT(t), respParams("again", prev)); err != nil {
		t.Fatal(err)
	}
	if len(obsB.counts()) != 1 {
		t.Fatalf("router b spread the conversation: %v", obsB.counts())
	}
	// An id no engine holds: routed, the engine's 404 passes through.
	_, err = b.Responses.New(ctxT(t), respParams("x", "resp_nobody_has_it"))
	var apiErr *openai.Error
	if !asAPIError(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Param != "response_id" {
		t.Fatalf("unknown everywhere: %v", err)
	}
}
