package slowpath_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/slowpath"
)

// npmClientDir installs testdata/npm (the official `openai` package, pinned
// by its lockfile) into a cache directory keyed by the lockfile's hash, with
// `npm ci` when its node_modules is missing, and copies the client script
// there. The source tree gets no node_modules.
func npmClientDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not installed (Debian: apt-get install nodejs npm; .ci/run installs it): the npm openai client test needs it")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatal("npm is not installed (Debian: apt-get install nodejs npm; .ci/run installs it): the npm openai client test needs it")
	}
	lock, err := os.ReadFile("testdata/npm/package-lock.json")
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256(lock)
	dir := filepath.Join(cache, "warmpath", "npm-"+hex.EncodeToString(sum[:6]))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"package.json", "package-lock.json", "client.mjs"} {
		b, err := os.ReadFile(filepath.Join("testdata/npm", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai", "package.json")); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--cache", filepath.Join(dir, ".npm-cache"))
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}
	return dir
}

// TestNPMOpenAIClient runs the npm `openai` package (node) against warmpath
// in front of enginesim: chat streamed and not, the Responses API (a
// streamed turn chained with previous_response_id), the model list with the
// engines' fields, unknown model and unknown previous response (404s),
// bad JSON (400 with the location) and a stream the engine breaks (the SDK
// throws on the router's error event).
func TestNPMOpenAIClient(t *testing.T) {
	dir := npmClientDir(t)
	engines := startEngines(t, 2, func(c *enginesim.Config) { c.MaxModelLen = 8192 })
	_, _, _, base := startAPI(t, engines, func(c *slowpath.Config) { c.Routing.Policy = "round-robin" })
	breaking := startEngines(t, 1, func(c *enginesim.Config) { c.Faults.CloseAfterChunks = 2 })
	_, _, _, brokenBase := startAPI(t, breaking, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "client.mjs", base, brokenBase, e2eModel)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	var got struct {
		ChatText                        string
		ChatChunks                      int
		RespID, RespText                string
		StreamFirst, StreamLast         string
		StreamText, StreamCompletedText string
		StreamCached                    int
		Models                          [][]any
		UnknownModel, UnknownPrev       []any
		BadJSON                         []any
		Broken                          []any
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("client output %s: %v", out, err)
	}
	t.Logf("npm openai client saw: %s", out)
	switch {
	case got.ChatText == "" || got.ChatChunks < 3:
		t.Fatalf("chat: %+v", got)
	case !strings.HasPrefix(got.RespID, "resp_") || got.RespText == "":
		t.Fatalf("responses: %+v", got)
	case got.StreamFirst != "response.created" || got.StreamLast != "response.completed" || got.StreamText == "" ||
		got.StreamText != got.StreamCompletedText || got.StreamCached == 0:
		t.Fatalf("chained responses stream (round-robin: it must be pinned to the first response's replica): %+v", got)
	case len(got.Models) != 1 || got.Models[0][0] != e2eModel || got.Models[0][1] != "vllm" || got.Models[0][2] != float64(8192) || got.Models[0][3] != e2eModel:
		t.Fatalf("models: %v", got.Models)
	case len(got.UnknownModel) != 4 || got.UnknownModel[0] != float64(404) || got.UnknownModel[1] != "model_not_found" || got.UnknownModel[2] != "model" || got.UnknownModel[3] != "NotFoundError":
		t.Fatalf("unknown model: %v", got.UnknownModel)
	case len(got.UnknownPrev) != 2 || got.UnknownPrev[0] != float64(404) || got.UnknownPrev[1] != "response_id":
		t.Fatalf("unknown previous response: %v", got.UnknownPrev)
	case len(got.BadJSON) != 2 || got.BadJSON[0] != float64(400) ||
		got.BadJSON[1] != "We could not parse the JSON body of your request: the body is truncated: it ends at byte 13 (line 1, column 14) inside an unfinished value.":
		t.Fatalf("bad JSON: %v", got.BadJSON)
	case len(got.Broken) != 2 || got.Broken[0] != float64(2) || !strings.Contains(got.Broken[1].(string), "upstream replica failed mid-stream"):
		t.Fatalf("broken stream: %v", got.Broken)
	}
}
