// Long because it is one job: the discrete-event loop of the cluster simulator
// (arrivals, router decisions, engine steps, scrapes, peer sync) shares one
// event queue and one clock.

package sim

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/bench/workload"
)

// Config describes one simulated cluster run.
type Config struct {
	// Replicas is the number of engines. 0 means 8.
	Replicas int
	// Engine configures every engine (virtual time; TimeScale is ignored).
	// A zero value means enginesim.DefaultConfig() (Llama-3.1-8B on one
	// H100). The served model names are replaced by the workload's models.
	Engine enginesim.Config
	// Engines, when set, configures each replica on its own (a fleet:
	// FleetEngines); len(Engines) must be Replicas, and Engine is ignored.
	// All must share one BlockSize. Replicas with Slots > 0 are llama.cpp
	// servers: the router sees llama.cpp's signals (slots from /props, no
	// KV capacity) and timings.
	Engines []enginesim.Config
	// Fleet names the fleet in the Result (reports); "" means "vllm".
	Fleet string
	// CacheModel is every replica's ReplicaSpec.CacheModel, as a
	// deployment's cache_model sets it: CacheAuto (the default) discovers
	// llama.cpp's per-slot caches from its signals; CacheShared routes
	// every fleet with the prefix index alone (an ablation).
	CacheModel affinity.CacheModel
	// Policy names the router policy: one of Policies(). "" means "cost".
	Policy string
	// Router configures warmpath's affinity.Router (hashing, cost-policy
	// knobs). Its Policy field is ignored.
	Router affinity.Config
	// ScrapeInterval is how often the router reads each engine's signals
	// (waiting, running, KV usage ratio; llama.cpp's slots), as the proxy
	// scrapes /metrics. 0 means 1s, the proxy's default (slowpath
	// scrape.interval). Each replica is scraped once before the first
	// request, as the proxy scrapes a replica when its control loop
	// starts, then at its own phase of the interval, so its signals are up
	// to one interval stale.
	ScrapeInterval time.Duration
	// NoStepClock withholds a streamed answer's tokens after the first
	// from the router (Router.Token), so it knows nothing of the engines'
	// steps (affinity/stepphase.go): an ablation.
	NoStepClock bool
	// Seed seeds the router's tie-breaking and random policies.
	Seed uint64
	// KeepOutcomes records every request's outcome in Result.Outcomes.
	KeepOutcomes bool

	// Routers is the number of router instances (warmpath instances behind
	// ECMP or DNS) in front of the same engines. Each request goes to one
	// of them chosen uniformly at random (seeded; a conversation's turns
	// land on random routers too). Each is its own affinity.Router with its
	// own index, load counters and policy state; all scrape the engines'
	// signals. 0 means 1: a single router, exactly the behaviour and the
	// numbers without this field. At most affinity.MaxPeers.
	Routers int
	// Sync makes the routers share what they learn: each router's
	// affinity.PeerSink updates (index inserts, truncations, absolute
	// per-replica load) are applied to every other router (ApplyPeer)
	// SyncDelay after the event that produced them. false: each router
	// learns only its own traffic. Ignored with one router.
	Sync bool
	// SyncDelay is the propagation delay of a peer update, in virtual time
	// (publish, transport, apply; a batch interval adds its mean to it). 0
	// delivers an update before the next decision at the same instant.
	SyncDelay time.Duration
}

// Outcome is one request's fate, kept when Config.KeepOutcomes is set.
type Outcome struct {
	ID           int
	Replica      int
	TTFT, E2E    float64 // seconds
	CachedTokens int     // engine-reported prefix hit
	Predicted    int     // router-predicted cached tokens
	PromptTokens int     // as the engine counted them
	Arrival      float64 // seconds of virtual time
	Finish       float64
	OK           bool
	Router       int `json:",omitempty"` // the router instance that decided (Config.Routers > 1)
	// PredictedTTFT is the router's TTFT model at Begin (seconds); Busy
	// the requests on the replica then (this one not counted); Scheduled
	// when the engine first gave it a batch slot (seconds of virtual time).
	PredictedTTFT float64
	Busy          int
	Scheduled     float64
	// Submitted is when it reached the engine (seconds of virtual time):
	// after Arrival when the router held it for a busy slot; PredictedTTFT
	// counts from here, TTFT from Arrival.
	Submitted float64
}

func (c Config) withDefaults() Config {
	if c.Replicas == 0 {
		c.Replicas = 8
	}
	if len(c.Engine.ServedModelNames) == 0 && c.Engine.BlockSize == 0 {
		c.Engine = enginesim.DefaultConfig()
	}
	if c.Policy == "" {
		c.Policy = affinity.DefaultPolicy
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = time.Second
	}
	if c.Fleet == "" {
		c.Fleet = "vllm"
	}
	if c.Routers == 0 {
		c.Routers = 1
	}
	return c
}

// Result summarises one run. Durations are in seconds.
type Result struct {
	Policy, Workload string
	Fleet            string
	Replicas         int
	Requests         int // offered
	Completed        int
	Failed           int // refused by every replica (no capacity) or by the engine
	TTFT             Dist
	E2E              Dist
	ITLMean          float64
	Makespan         float64 // first arrival to last finish
	RequestsPerSec   float64
	OutputTokPerSec  float64
	// HitRate is the per-request prefix hit rate: the completed requests'
	// cached tokens at first scheduling (usage.prompt_tokens_details.
	// cached_tokens) over their prompt tokens. The headline.
	HitRate float64
	// AdmissionHitRate is the engines' own counter ratio (vLLM's
	// prefix_cache_hits / prefix_cache_queries): every re-admission after
	// a preemption queries again and hits its own recomputed blocks, so it
	// runs above HitRate once engines preempt.
	AdmissionHitRate float64
	Imbalance        float64 // max requests on one replica / mean
	Preemptions      uint64  // preemptions of completed requests (each recomputes its KV)
	// PreemptedRequests is how many completed requests were preempted at
	// least once.
	PreemptedRequests int
	// TTFTModelError is how far the router's TTFT model (affinity/ttft.go)
	// was from each completed request's TTFT, as the factor max(actual /
	// predicted, predicted / actual): its median and 90th percentile.
	TTFTModelError struct{ P50, P90 float64 }
	Decisions      int
	// Holds is how many times a router held a request for a busy batch
	// slot (affinity.HoldAdvice); a request may be held more than once.
	Holds int `json:",omitempty"`
	// HoldCopies is how many times a router declined a hold whose waits
	// had come to the price of computing the prompt again (a copy).
	HoldCopies int `json:",omitempty"`
	// DecideNanos is wall time spent in the router: parse+hash+decide (not
	// the simulator's prompt text). A stored prompt's parse counts the time
	// its kept parse took when it ran (parsedPrompt), once per arrival.
	DecideNanos int64
	// Scale-out (Config.Routers > 1 with Sync): peer messages (one per
	// router call that produced updates) and updates applied, summed over
	// receiving routers, and the wall time spent applying them.
	PeerMessages int   `json:",omitempty"`
	PeerUpdates  int   `json:",omitempty"`
	ApplyNanos   int64 `json:",omitempty"`
	Outcomes     []Outcome
}

// Dist is a latency distribution summary, in seconds.
type Dist struct{ Mean, P50, P90, P99 float64 }

func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	q := func(p float64) float64 { return xs[min(len(xs)-1, int(p*float64(len(xs))))] }
	return Dist{Mean: sum / float64(len(xs)), P50: q(0.50), P90: q(0.90), P99: q(0.99)}
}

// flight is one request in the simulation.
type flight struct {
	req       enginesim.Request
	fl        affinity.Flight
	replica   int
	router    int // index in cluster.routers
	idx       int // index in the workload
	predicted int
	wreq      *workload.Request
	arrived   int64 // the request's arrival: it may have been held before Submit
}

type cluster struct {
	cfg     Config
	routers []instance // one per Config.Routers
	engines []*enginesim.Engine
	ids     []affinity.ReplicaID
	heap    engineHeap
	res     *Result
	pick    *rand.Rand // the router of each arrival (Routers > 1)
	mail    mailHeap   // peer messages in flight (Sync)
	mailSeq uint64

	w        *workload.Workload
	conv     *conversations
	arrivals arrivalHeap  // arrivals, and (idx -1-k) wakes of router k's held requests
	held     [][]*heldReq // by router: requests held for a busy slot

	llama              []bool                                      // replica is a llama.cpp server (Engines[i].Slots > 0)
	fresh              []int                                       // its empty slots at its first scrape (/slots beside /props); -1 before
	phase              []int64                                     // replica -> its scrape phase within the interval
	order              []int                                       // replicas by phase: the scrape order
	specs              []affinity.ReplicaSpec                      // what each replica was added with (every router the same)
	onSignals          func(replica int, s affinity.EngineSignals) // tests: every signal the routers get, after they got it
	cachedIn, promptIn int64                                       // completed requests' cached and prompt tokens (HitRate)

	ttft, e2e []float64
	modelErr  []float64 // TTFT model error factors (Result.TTFTModelError)
	itlSum    float64
	itlN      int
	perRep    []int
	outTokens int64
	last      int64
}

// simState is what baseline policies may read beyond the View: the
// router-local bookkeeping a real implementation of that baseline keeps
// (Dynamo's active blocks per worker, SGLang's tree size per worker).
type simState struct {
	activeTokens []int // prompt+generated tokens of in-flight requests, by replica id
	treeTokens   []int // tokens inserted per replica (SGLang's approximate tree size)
	engines      []*enginesim.Engine
	enginePrompt []byte // the current request as the engines see it (oracle)
	adapter      string
}

// Run simulates w on a cluster and returns its summary. It is deterministic
// for a given Config and workload (wall-clock DecideNanos aside).
func Run(cfg Config, w *workload.Workload) (*Result, error) {
	c, err := newCluster(cfg, w)
	if err != nil {
		return nil, err
	}
	// the engines' KV caches serve the next run once this one is done
	defer func() {
		for _, e := range c.engines {
			e.Release()
		}
	}()
	if err := c.loop(w); err != nil {
		return nil, err
	}
	return c.finish(w), nil
}

// newCluster builds the engines and the routers. The routers get what a
// production router has before any traffic: each replica's name and models
// (ReplicaSpec with no rate, capacity or batch size: those it learns from
// scrapes, TTFTs and usage, as slowpath feeds them).
func newCluster(cfg Config, w *workload.Workload) (*cluster, error) {
	cfg = cfg.withDefaults()
	if cfg.Replicas < 1 {
		return nil, fmt.Errorf("sim: replicas must be >= 1, got %d", cfg.Replicas)
	}
	if len(w.Requests) == 0 {
		return nil, errors.New("sim: empty workload")
	}
	if cfg.Engines != nil && len(cfg.Engines) != cfg.Replicas {
		return nil, fmt.Errorf("sim: %d engine configs for %d replicas", len(cfg.Engines), cfg.Replicas)
	}
	models := []string{}
	for i := range w.Requests {
		if !slices.Contains(models, w.Requests[i].Model) {
			models = append(models, w.Requests[i].Model)
		}
	}
	ecfgs := make([]enginesim.Config, cfg.Replicas)
	for i := range ecfgs {
		e := cfg.Engine
		if cfg.Engines != nil {
			e = cfg.Engines[i]
		}
		e.ServedModelNames = models
		if err := e.Validate(); err != nil {
			return nil, fmt.Errorf("sim: engine %d: %w", i, err)
		}
		if e.BlockSize != ecfgs[0].BlockSize && i > 0 {
			return nil, fmt.Errorf("sim: engine %d: block size %d, engine 0 has %d", i, e.BlockSize, ecfgs[0].BlockSize)
		}
		ecfgs[i] = e
	}
	if cfg.Routers < 1 || cfg.Routers > affinity.MaxPeers {
		return nil, fmt.Errorf("sim: routers must be in [1, %d], got %d", affinity.MaxPeers, cfg.Routers)
	}
	if cfg.SyncDelay < 0 {
		return nil, fmt.Errorf("sim: sync delay must be >= 0, got %v", cfg.SyncDelay)
	}
	c := &cluster{cfg: cfg, perRep: make([]int, cfg.Replicas), held: make([][]*heldReq, cfg.Routers),
		res: &Result{Policy: cfg.Policy, Workload: w.Name, Fleet: cfg.Fleet, Replicas: cfg.Replicas, Requests: len(w.Requests)}}
	sync := cfg.Sync && cfg.Routers > 1
	for k := range cfg.Routers {
		st := &simState{activeTokens: make([]int, cfg.Replicas), treeTokens: make([]int, cfg.Replicas)}
		rcfg := cfg.Router
		rcfg.Seed = cfg.Seed + 1 + uint64(k)
		router, err := newRouter(cfg.Policy, rcfg, st, ecfgs[0].BlockSize)
		if err != nil {
			return nil, err
		}
		in := instance{router: router, st: st}
		if sync {
			in.out = &outbox{}
			router.SetPeerSink(in.out)
		}
		c.routers = append(c.routers, in)
	}
	if cfg.Routers > 1 {
		c.pick = rand.New(rand.NewPCG(cfg.Seed, 0x5ca1e0))
	}
	for i := 0; i < cfg.Replicas; i++ {
		e, err := enginesim.NewEngine(ecfgs[i])
		if err != nil {
			return nil, fmt.Errorf("sim: engine: %w", err)
		}
		spec := affinity.ReplicaSpec{Name: fmt.Sprintf("engine-%d", i), Models: models, CacheModel: cfg.CacheModel}
		c.specs = append(c.specs, spec)
		// every router knows the replicas in the same order, so replica IDs
		// agree and peer updates need no translation
		for _, in := range c.routers {
			id, err := in.router.AddReplica(spec)
			if err != nil {
				return nil, err
			}
			if int(id) != i {
				return nil, fmt.Errorf("sim: router gave replica %d id %d", i, id)
			}
		}
		c.engines = append(c.engines, e)
		c.ids = append(c.ids, affinity.ReplicaID(i))
		c.llama = append(c.llama, ecfgs[i].Slots > 0)
		c.fresh = append(c.fresh, -1)
		// each replica's scrape loop starts at its own moment (slowpath
		// runs one ticker per replica)
		c.phase = append(c.phase, int64(splitmix(cfg.Seed^uint64(i)*0x9e3779b97f4a7c15)%uint64(cfg.ScrapeInterval)))
		c.order = append(c.order, i)
	}
	slices.SortStableFunc(c.order, func(a, b int) int { return cmpInt64(c.phase[a], c.phase[b]) })
	for _, in := range c.routers {
		in.st.engines = c.engines
	}
	c.heap = engineHeap{at: make([]int64, cfg.Replicas), pos: make([]int, cfg.Replicas)}
	for i := range c.engines {
		c.heap.items = append(c.heap.items, i)
		c.heap.pos[i] = i
		c.heap.at[i] = enginesim.NoEvent
	}
	heap.Init(&c.heap)
	c.w = w
	return c, nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// splitmix is SplitMix64's finaliser: a seeded, well-mixed hash.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// tokenDensity is request id's real tokens per router-estimated token: the
// router estimates tokens as canonical bytes / 4 (affinity's
// bytes_per_token), while a real tokenizer's bytes per token vary with the
// text (Llama-3's runs ~3.5 on code to ~4.5 on English prose). Engines
// report usage in real tokens, so the router's cached-token and prefill
// figures differ from its own estimates by this factor: log-normal, median
// 1/1.05 (4.2 bytes per token), sigma 0.1, clamped to [0.7, 1.3];
// deterministic per seed and request.
func tokenDensity(seed uint64, id int) float64 {
	h := splitmix(seed ^ 0x70c3 ^ uint64(id)*0xd1b54a32d192ed03)
	u1 := (float64(h>>11) + 0.5) / (1 << 53)
	u2 := float64(splitmix(h)>>11) / (1 << 53)
	z := math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
	return min(max(math.Exp(0.1*z)/1.05, 0.7), 1.3)
}

// conversations drives multi-turn chats closed loop: turn k+1 of a
// conversation arrives its think time after turn k finished (not at its
// pre-scheduled time), and its prompt carries the engine's real answers to
// the earlier turns, as a chat client sends them. So the engines' cached
// answer blocks are reusable, exactly as in a real chat.
type conversations struct {
	next    []int      // request index -> the same conversation's next turn, -1 if none
	think   []int64    // request index -> its think time after the previous turn
	answers [][][]byte // conversation -> the engine's answer of each finished turn
}

func newConversations(w *workload.Workload) *conversations {
	cv := &conversations{next: make([]int, len(w.Requests)), think: make([]int64, len(w.Requests))}
	last := map[int]int{}
	maxConv := -1
	for i := range w.Requests {
		cv.next[i] = -1
		r := &w.Requests[i]
		if r.Conversation < 0 {
			continue
		}
		maxConv = max(maxConv, r.Conversation)
		if j, ok := last[r.Conversation]; ok && r.Turn == w.Requests[j].Turn+1 {
			cv.next[j] = i
			cv.think[i] = max(0, r.Arrival-w.Requests[j].Arrival)
		}
		last[r.Conversation] = i
	}
	cv.answers = make([][][]byte, maxConv+1)
	return cv
}

// arrival is a pending request arrival.
type arrival struct {
	at  int64
	idx int
}

type arrivalHeap []arrival

func (h arrivalHeap) Len() int { return len(h) }
func (h arrivalHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || (h[i].at == h[j].at && h[i].idx < h[j].idx)
}
func (h arrivalHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *arrivalHeap) Push(x any)   { *h = append(*h, x.(arrival)) }
func (h *arrivalHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func (c *cluster) loop(w *workload.Workload) error {
	p := affinity.NewParser(c.routers[0].router.HashConfig())
	var (
		prompt affinity.Prompt
		req    affinity.Request
		d      affinity.Decision
		body   []byte
		msgs   []enginesim.Message
		ep     []byte   // the engine prompt
		desc   []byte   // what it is made of (appendPromptDesc)
		hs     []uint64 // its block hashes, when sharedHashes lacks them
		spans  [][2]int // message -> its text in body
		// the current request's earlier answers (a conversation's), and
		// how many of them its messages used so far
		answers [][]byte
		na      int
		wr      *workload.Request
	)
	tc := newTextCache()
	hcfg := c.routers[0].router.HashConfig()
	var parsedNanos int64 // the last parse's wall time
	bs := c.engines[0].BlockSize()
	oracle := c.cfg.Policy == "oracle" // reads each request's engine prompt
	var (
		pe *hashEntry // the current request's stored text and hashes
		si int        // its next segment
	)
	content := func(dst []byte, mi int) []byte {
		m := &wr.Messages[mi]
		if pe != nil && pe.text != nil {
			for range m.Segments {
				dst = append(dst, pe.text[si]...)
				si++
			}
			return dst
		}
		if m.Role != workload.Assistant {
			return tc.appendMessage(dst, m)
		}
		na++
		if na <= len(answers) {
			return append(dst, answers[na-1]...)
		}
		return tc.appendMessage(dst, m)
	}
	cv := newConversations(w)
	c.conv = cv
	followers := make([]bool, len(w.Requests))
	for _, n := range cv.next {
		if n >= 0 {
			followers[n] = true
		}
	}
	c.arrivals = make(arrivalHeap, 0, len(w.Requests))
	for i := range w.Requests {
		if !followers[i] {
			c.arrivals = append(c.arrivals, arrival{w.Requests[i].Arrival, i})
		}
	}
	heap.Init(&c.arrivals)
	// scrapes: replica order[k] at scrapeBase + phase[order[k]]
	scrapeBase, sk := w.Requests[0].Arrival, 0
	// The proxy scrapes each replica as its control loop starts, right
	// after its first health check (slowpath's runReplica): a fleet's
	// routers are up before its traffic and begin knowing every engine
	// idle, with its batch slots and KV capacity.
	for _, i := range c.order {
		c.scrape(i, scrapeBase)
	}
	scrapeAt := func() int64 { return scrapeBase + c.phase[c.order[sk]] }
	scrape := scrapeAt()
	obs := observer{c}
	for {
		tArr := int64(math.MaxInt64)
		if len(c.arrivals) > 0 {
			tArr = c.arrivals[0].at
		}
		tEng := c.heap.min()
		if tArr == math.MaxInt64 && tEng == enginesim.NoEvent {
			return nil
		}
		// peer updates due now or earlier reach their routers first
		if len(c.mail) > 0 {
			if tMail := c.mail[0].at; tMail <= tArr && tMail <= tEng && tMail <= scrape {
				c.deliver()
				continue
			}
		}
		// scrape ticks only while something is happening
		if scrape <= tArr && scrape <= tEng {
			c.scrape(c.order[sk], scrape)
			if sk++; sk == len(c.order) {
				sk = 0
				scrapeBase += int64(c.cfg.ScrapeInterval)
			}
			scrape = scrapeAt()
			continue
		}
		if tEng <= tArr {
			i := c.heap.items[0]
			c.engines[i].Advance(tEng, obs)
			c.heap.update(i, c.engines[i].NextEventTime())
			continue
		}
		a := heap.Pop(&c.arrivals).(arrival)
		if a.idx < 0 {
			k, until := wakeOf(a.idx)
			c.wake(k, a.at, until, &d)
			continue
		}
		wr = &w.Requests[a.idx]
		// earlier answers of a conversation are the engine's real ones
		answers = nil
		if wr.Conversation >= 0 {
			answers = cv.answers[wr.Conversation]
		}
		// a prompt of segments alone is the same in every run: its text
		// and block hashes are kept across runs (sharedHashes)
		pe, si = nil, 0
		plain := len(answers) == 0 || !hasAssistant(wr)
		if plain {
			desc = appendPromptDesc(desc[:0], wr, bs)
			pe = sharedHashes.get(desc)
		}
		// A stored prompt's body parses as it did the first time
		// (parsedPrompt): its text is neither written nor parsed again,
		// unless the oracle reads the engine prompt rendered from it.
		var pp *parsedPrompt
		if pe != nil && !oracle {
			pp = pe.parsedFor(hcfg, wr.Model)
		}
		if pp != nil {
			req = affinity.Request{Model: pp.model, Hashes: pp.hashes, PromptTokens: pp.tokens,
				SessionKey: uint64(wr.Client) + 1, Now: a.at}
			c.res.DecideNanos += pp.nanos
		} else {
			// each message's text once, into the body; the engine prompt is
			// rendered from the body's spans
			na = 0
			tc.record, tc.segs = plain && pe == nil, tc.segs[:0]
			body, spans = workload.AppendChatBodyContent(body[:0], wr, true, content, spans[:0])
			tc.record = false
			// router CPU: what the proxy does per request (parse, hash,
			// decide), not the simulator's making of the prompt text
			start := time.Now()
			if err := p.ParseChat(body, &prompt); err != nil {
				return fmt.Errorf("sim: request %d: %w", wr.ID, err)
			}
			req = affinity.Request{Model: prompt.Model, Hashes: prompt.Hashes, PromptTokens: prompt.Tokens,
				SessionKey: uint64(wr.Client) + 1, Now: a.at}
			nanos := time.Since(start).Nanoseconds()
			c.res.DecideNanos += nanos
			parsedNanos = nanos
		}
		// what the engines will see: their own chat template, rendered from
		// the body, unless the stored hashes stand for all of it but its
		// tail and no policy reads it (the oracle does)
		var eprompt []byte
		var promptBytes int
		var bh []uint64
		if pe != nil && !oracle {
			eprompt, promptBytes, bh = pe.tail, pe.promptBytes, pe.hashes
		} else {
			msgs = msgs[:0]
			for mi, sp := range spans {
				msgs = append(msgs, enginesim.Message{Role: wr.Messages[mi].Role.String(), Content: transient(body[sp[0]:sp[1]])})
			}
			// the engine reads its prompt only in Submit: one buffer serves all
			ep = enginesim.AppendChatPrompt(ep[:0], msgs, nil)
			if plain && pe == nil {
				hs = enginesim.BlockHashes(hs[:0], ep, bs, "", "")
				pe = sharedHashes.put(desc, hs, tc.segs, len(ep), enginesim.PromptTail(ep, bs))
			}
			if pe != nil {
				bh = pe.hashes
			}
			eprompt = ep
		}
		if pe != nil && pp == nil && !oracle {
			pe.keepParsed(hcfg, &prompt, parsedNanos)
		}
		k := 0
		if c.pick != nil {
			k = c.pick.IntN(len(c.routers))
		}
		c.route(k, &req, &d, wr, a.idx, a.at, a.at, eprompt, promptBytes, bh, nil)
	}
}

// heldReq is a request a router holds for a busy batch slot
// (affinity.HoldAdvice), with what it needs to be decided again.
type heldReq struct {
	req         affinity.Request // its own copy of the hashes
	adv         affinity.HoldAdvice
	wr          *workload.Request
	idx         int
	arrived     int64
	prompt      []byte // its own copy
	promptBytes int
	bh          []uint64
	queued      int64 // the Until a wake event is queued for (0: none)
}

// Wake events share the arrival heap with negative indices: router k's
// held requests decide again when one of its requests ends (-1-2k), or
// when a hold reaches its Until (-2-2k: only those past their Until).
func wakeIdx(k int, until bool) int {
	if until {
		return -2 - 2*k
	}
	return -1 - 2*k
}

func wakeOf(idx int) (k int, until bool) {
	j := -1 - idx
	return j / 2, j%2 == 1
}

// route decides request req (workload request wr, index idx) at router k
// at now and begins it on the chosen replica, or, where the decision
// advises a hold, keeps it (heldReq) until a request of router k ends or
// the hold's Until, as the proxy does (slowpath's holdSlot): advice for
// the same slot and request in it keeps its first Until, and a hold that
// reaches Until makes the request's next decisions NoHold. arrived is the
// request's arrival (its TTFT counts from it); h its hold when it was
// held.
func (c *cluster) route(k int, req *affinity.Request, d *affinity.Decision, wr *workload.Request, idx int, now, arrived int64,
	prompt []byte, promptBytes int, bh []uint64, h *heldReq) {
	in := &c.routers[k]
	in.st.enginePrompt = prompt
	for {
		req.Now = now
		start := time.Now()
		err := in.router.Decide(req, d)
		c.res.DecideNanos += time.Since(start).Nanoseconds()
		c.res.Decisions++
		if err != nil || len(d.Ranked) == 0 {
			c.res.Failed++
			c.followUp(idx, now, nil)
			return
		}
		if !d.Hold.Holding() {
			break
		}
		if h != nil {
			d.Hold.Continues(h.adv)
		}
		req.Hold(d.Hold, now)
		if d.Hold.Until <= now {
			req.NoHold = true
			continue
		}
		if h == nil {
			h = &heldReq{wr: wr, idx: idx, arrived: arrived, prompt: slices.Clone(prompt), promptBytes: promptBytes, bh: bh}
			h.req = *req
			h.req.Model = slices.Clone(req.Model) // the parser's scratch or a shared kept parse
			h.req.Hashes = slices.Clone(req.Hashes)
		} else {
			h.req.NoHold, h.req.HoldSince, h.req.HeldFor = req.NoHold, req.HoldSince, req.HeldFor
		}
		h.adv = d.Hold
		in.router.Hold(d.Hold, 1)
		c.held[k] = append(c.held[k], h)
		if h.queued != d.Hold.Until {
			h.queued = d.Hold.Until
			heap.Push(&c.arrivals, arrival{d.Hold.Until, wakeIdx(k, true)})
		}
		c.res.Holds++
		return
	}
	f := &flight{replica: int(d.Ranked[0]), router: k, wreq: wr, idx: idx, predicted: d.CachedTokens[0], arrived: arrived}
	f.req = enginesim.Request{ID: uint64(wr.ID) + 1, Prompt: prompt, PromptBytes: promptBytes, MaxTokens: wr.OutputTokens, Data: f, BlockHashes: bh}
	in.router.Begin(d.Ranked[0], req, d, &f.fl)
	c.post(k, now)
	e := c.engines[f.replica]
	err := e.Submit(&f.req, now)
	f.req.Prompt, f.req.BlockHashes = nil, nil // ep is reused for the next request, pe's are shared
	if err != nil {
		in.router.End(&f.fl, now, -1, false)
		c.post(k, now)
		c.res.Failed++
		c.followUp(idx, now, nil)
		return
	}
	in.st.activeTokens[f.replica] += f.req.PromptTokens + wr.OutputTokens
	in.st.treeTokens[f.replica] += f.req.PromptTokens
	c.perRep[f.replica]++
	c.heap.update(f.replica, e.NextEventTime())
}

// wake decides again, at now, the requests router k holds: every one
// when a request of its ended (a slot may have freed), only those past
// their Until at a hold's Until (until), as the proxy's timers do.
func (c *cluster) wake(k int, now int64, until bool, d *affinity.Decision) {
	hs := c.held[k]
	if len(hs) == 0 {
		return
	}
	c.held[k] = nil
	var due []*heldReq
	for _, h := range hs {
		if until && h.adv.Until > now {
			c.held[k] = append(c.held[k], h)
			continue
		}
		c.routers[k].router.Hold(h.adv, -1)
		due = append(due, h)
	}
	for _, h := range due {
		if now >= h.adv.Until {
			h.req.NoHold = true
		}
		c.route(k, &h.req, d, h.wr, h.idx, now, h.arrived, h.prompt, h.promptBytes, h.bh, h)
	}
}

// hasAssistant reports whether r has an assistant message (an earlier
// turn, which a closed-loop conversation fills with the engine's answer).
func hasAssistant(r *workload.Request) bool {
	for i := range r.Messages {
		if r.Messages[i].Role == workload.Assistant {
			return true
		}
	}
	return false
}

// followUp records request i's answer and schedules its conversation's next
// turn its think time after now. A failed turn leaves an empty answer: the
// user asks again regardless.
func (c *cluster) followUp(i int, now int64, answer []byte) {
	cv := c.conv
	r := &c.w.Requests[i]
	if r.Conversation >= 0 {
		cv.answers[r.Conversation] = append(cv.answers[r.Conversation], answer)
	}
	if n := cv.next[i]; n >= 0 {
		heap.Push(&c.arrivals, arrival{now + cv.think[n], n})
	}
}

// scrape reads replica i's signals at now, as slowpath's scrape does:
// vLLM's waiting, running, KV usage ratio and KV capacity (its
// cache_config_info: block_size x num_gpu_blocks, and whether prefix
// caching is on); llama.cpp's deferred, processing and KV usage ratio,
// with its slots from /props and the empty ones from /slots (at the
// first scrape), no capacity, and per-slot caches
// (affinity.EngineSignals.SlotCaches).
func (c *cluster) scrape(i int, now int64) {
	e := c.engines[i]
	st := e.Stats()
	// At 0 is the router's "never scraped": a workload whose first request
	// arrives at 0 has its first scrape there, and the proxy's clock is
	// never 0.
	sig := affinity.EngineSignals{Waiting: st.Waiting, Running: st.Running, KVUsage: st.KVUsage(), At: max(now, 1)}
	if c.llama[i] {
		sig.BatchSlots = c.cfg.engine(i).Slots
		sig.SlotCaches = true // the proxy's: llama.cpp's /metrics
		if c.fresh[i] < 0 {
			c.fresh[i] = e.FreshSlots() // read once, as the proxy reads /slots with /props
		}
		sig.FreshSlots = c.fresh[i]
	} else {
		sig.KVCapacityTokens = st.TotalBlocks * e.BlockSize()
		// cache_config_info's enable_prefix_caching label, for the
		// routers that read it (readsPrefixCacheFlag)
		sig.NoPrefixCache = c.cfg.engine(i).DisablePrefixCaching && readsPrefixCacheFlag(c.cfg.Policy)
	}
	for _, in := range c.routers {
		in.router.SetSignals(c.ids[i], sig)
	}
	if c.onSignals != nil {
		c.onSignals(i, sig)
	}
}

// engine is replica i's configuration.
func (c Config) engine(i int) enginesim.Config {
	if c.Engines != nil {
		return c.Engines[i]
	}
	return c.Engine
}

type observer struct{ c *cluster }

// OnToken is a streamed answer's event reaching the router: the first
// token, then every token (each a step's output), as the proxy's relay
// reads them (Router.Token).
func (o observer) OnToken(r *enginesim.Request, at int64) {
	f := r.Data.(*flight)
	rt := o.c.routers[f.router].router
	if r.OutputTokens == 1 {
		rt.FirstToken(&f.fl, at)
		o.c.post(f.router, at)
	}
	if !o.c.cfg.NoStepClock {
		rt.Token(&f.fl, at)
	}
}

func (o observer) OnFinish(r *enginesim.Request, at int64) {
	c := o.c
	f := r.Data.(*flight)
	ok := r.Finish == enginesim.FinishStop || r.Finish == enginesim.FinishLength
	in := &c.routers[f.router]
	// the engine reports usage in real tokens (tokenDensity); llama.cpp
	// also its own prompt and decode timings
	dens := tokenDensity(c.cfg.Seed, f.wreq.ID)
	out := affinity.Outcome{OK: ok, CachedTokens: int(math.Round(float64(r.CachedTokens) * dens)), PromptTokens: int(math.Round(float64(r.PromptTokens) * dens))}
	if c.llama[f.replica] && ok {
		out.PrefillTokens = int(math.Round(float64(r.PromptTokens-r.CachedTokens) * dens))
		out.PrefillSeconds = float64(r.FirstTokenAt-r.ScheduledAt) / 1e9
		out.DecodeSeconds = float64(r.FinishedAt-r.FirstTokenAt) / 1e9
	}
	in.router.EndWith(&f.fl, at, out)
	c.post(f.router, at)
	if len(c.held[f.router]) > 0 {
		heap.Push(&c.arrivals, arrival{at, wakeIdx(f.router, false)})
	}
	if pred, act := f.fl.PredictedTTFT(), float64(r.FirstTokenAt-r.Arrival)/1e9; ok && pred > 0 && act > 0 {
		c.modelErr = append(c.modelErr, max(act/pred, pred/act))
	}
	var answer []byte
	if ok && f.wreq.Conversation >= 0 {
		answer = r.AppendOutput(nil, 0, r.OutputTokens)
	}
	c.followUp(f.idx, at, answer)
	in.st.activeTokens[f.replica] -= r.PromptTokens + f.wreq.OutputTokens
	if c.cfg.KeepOutcomes {
		c.res.Outcomes = append(c.res.Outcomes, Outcome{ID: f.wreq.ID, Replica: f.replica, OK: ok,
			TTFT: float64(r.FirstTokenAt-f.arrived) / 1e9, E2E: float64(r.FinishedAt-f.arrived) / 1e9,
			CachedTokens: r.CachedTokens, Predicted: f.predicted, PromptTokens: r.PromptTokens,
			Arrival: float64(f.arrived) / 1e9, Finish: float64(r.FinishedAt) / 1e9, Router: f.router,
			PredictedTTFT: f.fl.PredictedTTFT(), Busy: f.fl.BusyAtBegin(), Scheduled: float64(r.ScheduledAt) / 1e9, Submitted: float64(r.Arrival) / 1e9})
	}
	if !ok {
		c.res.Failed++
		return
	}
	c.res.Completed++
	c.res.Preemptions += uint64(r.Preemptions)
	if r.Preemptions > 0 {
		c.res.PreemptedRequests++
	}
	c.cachedIn += int64(r.CachedTokens)
	c.promptIn += int64(r.PromptTokens)
	c.ttft = append(c.ttft, float64(r.FirstTokenAt-f.arrived)/1e9)
	c.e2e = append(c.e2e, float64(r.FinishedAt-f.arrived)/1e9)
	if r.OutputTokens > 1 {
		c.itlSum += float64(r.FinishedAt-r.FirstTokenAt) / 1e9 / float64(r.OutputTokens-1)
		c.itlN++
	}
	c.outTokens += int64(r.OutputTokens)
	c.last = max(c.last, at)
}

func (c *cluster) finish(w *workload.Workload) *Result {
	r := c.res
	r.TTFT = dist(c.ttft)
	r.E2E = dist(c.e2e)
	if me := dist(c.modelErr); len(c.modelErr) > 0 {
		r.TTFTModelError.P50, r.TTFTModelError.P90 = me.P50, me.P90
	}
	if c.itlN > 0 {
		r.ITLMean = c.itlSum / float64(c.itlN)
	}
	r.Makespan = float64(c.last-w.Requests[0].Arrival) / 1e9
	if r.Makespan > 0 {
		r.RequestsPerSec = float64(r.Completed) / r.Makespan
		r.OutputTokPerSec = float64(c.outTokens) / r.Makespan
	}
	var hits, queries uint64
	for _, e := range c.engines {
		s := e.Stats()
		hits += s.PrefixHits
		queries += s.PrefixQueries
	}
	if queries > 0 {
		r.AdmissionHitRate = float64(hits) / float64(queries)
	}
	if c.promptIn > 0 {
		r.HitRate = float64(c.cachedIn) / float64(c.promptIn)
	}
	mx, sum := 0, 0
	for _, n := range c.perRep {
		mx = max(mx, n)
		sum += n
	}
	if sum > 0 {
		r.Imbalance = float64(mx) / (float64(sum) / float64(len(c.perRep)))
	}
	for _, rt := range c.routers {
		r.HoldCopies += int(rt.router.Stats().HoldCopies)
	}
	return r
}

// engineHeap is an indexed min-heap of engines by next event time.
type engineHeap struct {
	items []int   // engine indices
	pos   []int   // engine -> position in items
	at    []int64 // engine -> next event time
}

func (h *engineHeap) Len() int           { return len(h.items) }
func (h *engineHeap) Less(i, j int) bool { return h.at[h.items[i]] < h.at[h.items[j]] }
func (h *engineHeap) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.pos[h.items[i]] = i
	h.pos[h.items[j]] = j
}
func (h *engineHeap) Push(any)   { panic("fixed size") }
func (h *engineHeap) Pop() any   { panic("fixed size") }
func (h *engineHeap) min() int64 { return h.at[h.items[0]] }

// update sets engine e's next event time and restores the heap order: the
// steps of container/heap's Fix, with the comparisons and swaps written out
// (the loop calls it after every engine step and submit), so the heap, and
// which of two engines with the same time goes first, are Fix's.
func (h *engineHeap) update(e int, at int64) {
	h.at[e] = at
	i0 := h.pos[e]
	i, n := i0, len(h.items)
	for { // down
		j := 2*i + 1
		if j >= n {
			break
		}
		if j2 := j + 1; j2 < n && h.at[h.items[j2]] < h.at[h.items[j]] {
			j = j2
		}
		if !(h.at[h.items[j]] < h.at[h.items[i]]) {
			break
		}
		h.Swap(i, j)
		i = j
	}
	if i > i0 {
		return
	}
	for j := i0; j > 0; { // up
		p := (j - 1) / 2
		if !(h.at[h.items[j]] < h.at[h.items[p]]) {
			break
		}
		h.Swap(p, j)
		j = p
	}
}
