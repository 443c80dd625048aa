package affinity

// This file is the contract between affinity/ and its callers (slowpath/, bench/).
// Signatures here are stable; bodies live in the other files of the package.

import "errors"

// Sentinel errors returned by the hot path. They are preallocated so returning
// them costs nothing.
var (
	// ErrModelNotFound: no replica (healthy or not) serves the requested model.
	ErrModelNotFound = errors.New("model not found")
	// ErrNoReplica: the model is known but no replica is currently eligible
	// (all unhealthy, draining or at their concurrency limit).
	ErrNoReplica = errors.New("no replica available")
	// ErrBadRequest is what every parse failure wraps (a *FieldError).
	ErrBadRequest = errors.New("bad request")
)

// ReplicaID is a small dense index assigned by the Router when a replica is
// added. It is stable for the replica's lifetime and may be reused after
// RemoveReplica.
type ReplicaID int32

// NoReplica is the zero value of "no choice".
const NoReplica ReplicaID = -1

// ReplicaSpec describes one engine replica.
type ReplicaSpec struct {
	// Name is unique, usually the replica's host:port.
	Name string
	// Models lists the served model names (and LoRA adapter names).
	Models []string
	// Weight scales the replica's capacity relative to others. 0 means 1.
	Weight float64
	// KVCapacityTokens bounds the router's index for this replica, in tokens.
	// 0 means "unknown until the engine reports it"; a default is used.
	KVCapacityTokens int
	// PrefillTokensPerSec seeds the prefill-rate estimate. 0 means the default
	// (Config.DefaultPrefillTokensPerSec); measured rates replace it.
	PrefillTokensPerSec float64
	// MaxInFlight caps router-local concurrent requests. 0 means unlimited.
	MaxInFlight int
	// BatchSlots is how many requests the engine runs at once (vLLM
	// --max-num-seqs, SGLang --max-running-requests, llama.cpp -np); more
	// wait for a slot. 0 means from engine signals, else learned from
	// scrapes that show a full batch, else unknown (no slot term).
	BatchSlots int
	// CacheModel says how the engine caches prompts: CacheAuto (the
	// default) takes it from EngineSignals.SlotCaches.
	CacheModel CacheModel
}

// CacheModel is how an engine keeps prompts for reuse.
type CacheModel int8

const (
	// CacheAuto: from the engine's signals (EngineSignals.SlotCaches,
	// EngineSignals.NoPrefixCache), else CacheShared.
	CacheAuto CacheModel = iota
	// CacheShared: one prefix cache shared by every request (vLLM's and
	// SGLang's paged KV cache with prefix caching); the router's prefix
	// index predicts hits.
	CacheShared
	// CacheSlots: each batch slot keeps only its own last prompt and the
	// engine picks the slot (llama.cpp's llama-server); the router replays
	// that choice to predict hits (slotcache.go). Needs the batch slot
	// count (ReplicaSpec.BatchSlots or EngineSignals.BatchSlots).
	CacheSlots
	// CacheNone: the engine keeps nothing between requests (vLLM
	// --no-enable-prefix-caching, SGLang --disable-radix-cache): no hit is
	// predicted there, so every policy weighs such a replica as cold and
	// the cost policy balances load over it.
	CacheNone
)

// EngineSignals are the slow signals scraped from an engine's /metrics.
type EngineSignals struct {
	Waiting          int     // requests queued in the engine
	Running          int     // requests in the running batch
	KVUsage          float64 // fraction of KV cache in use, 0..1
	KVCapacityTokens int     // block_size * num_gpu_blocks; 0 = unknown
	BatchSlots       int     // requests the engine runs at once (llama.cpp total_slots); 0 = unknown
	SlotCaches       bool    // each slot caches only its own last prompt (llama.cpp): see CacheSlots
	NoPrefixCache    bool    // the engine reports its prefix cache off (vLLM enable_prefix_caching="False"): see CacheNone
	At               int64   // when scraped, nanoseconds on the caller's clock
	// Mark is this router's load on the replica when the scrape was sent
	// (Router.MarkSignals). The engine counted between sending and this
	// call; with the mark, requests that began in that window count as
	// this router's, so one that ended before the reply was read is not
	// taken for another router's. Zero: the load at SetSignals (a caller
	// that reads the engine synchronously, as the simulator does).
	Mark SignalMark
	// FreshSlots: how many batch slots held nothing when the router
	// first read the engine's slots (llama.cpp /slots: a slot that never
	// ran a task), 0 when unknown. Slots the router has not used since
	// are then known empty; without it they may hold any prompt the
	// engine ran before, and the cost policy advises no slot hold while
	// such a slot is idle (it may hold the prompt the hold waits for).
	FreshSlots int
}

// SignalMark is a replica's load as this router sees it at one moment
// (Router.MarkSignals), for EngineSignals.Mark.
type SignalMark struct {
	busy, pend int64  // in flight and awaiting a first token: this router's and its peers'
	began      uint64 // this router's Begins on the replica so far
	gen        uint32 // the replica's generation (IDs are reused)
	set        bool
}

// Request is what the Router decides on. Callers reuse one per goroutine.
type Request struct {
	Model        []byte   // model name as sent by the client
	Hashes       []uint64 // chained block hashes of the canonical prompt
	PromptTokens int      // estimated prompt tokens
	SessionKey   uint64   // hash of a session id or OpenAI `user`; 0 = none
	Now          int64    // nanoseconds on the caller's clock (virtual in the simulator)
	// Buffered: the response is not streamed, so FirstToken will only come
	// with the whole response. FirstToken then releases the pending prefill
	// but takes no prefill-rate sample (it would include the decode time).
	Buffered bool
	// NoHold: the caller will not wait, so Decide advises no hold
	// (Decision.Hold). A caller that held a request past a hold's Until
	// sets it for the request's next decisions.
	NoHold bool
	// HoldSince is when the caller first held the request (0: never), on
	// the same clock as Now: a request is held at most Config.SlotHold in
	// all.
	HoldSince int64
	// HeldFor is what the request's first hold promised (that advice's
	// HoldAdvice.Shared), set with HoldSince: the request's End compares
	// the tokens the engine reused with it (CostPolicy.hold).
	HeldFor int
}

// HoldAdvice is the cost policy's advice to wait before beginning: on an
// engine whose batch slots each keep only their own prompt (llama.cpp),
// the slot holding the request's prompt is busy, and waiting for it to
// free is predicted faster than computing the prompt again in another
// slot. The caller that follows it keeps the request, counts it with
// Router.Hold while it waits, and decides again when a request ends (the
// slot may have freed) or at Until, whichever is first, one woken request
// at a time deciding and beginning (requests woken together otherwise all
// see the freed slot and all begin there); past Until the
// prediction was wrong, and the request's next decisions set
// Request.NoHold. A caller that does not wait uses Decision.Ranked as
// always.
type HoldAdvice struct {
	Replica ReplicaID // whose slot to wait for
	// Owner names the request in that slot now: a later decision naming
	// the same replica and owner advises the same wait, and its Until
	// does not extend the first one's.
	Owner uint64
	Wait  float64 // predicted seconds until the request could begin there
	Until int64   // give up waiting then (Request.Now's clock)
	// Shared is the prompt tokens the slot's prompt shares with the
	// request: what waiting promises it reuses (Request.HeldFor).
	Shared int
	// Gain is the seconds waiting was predicted to save against beginning
	// on Ranked[0] now: the best estimate less the hold's. The wait lasts
	// past Wait by at most this (Until).
	Gain float64
	gen  uint32 // the replica's generation (IDs are reused)
	// rentKey names the promised prefix (its last block's hash) where the
	// slot's request has computed it: Router.Hold charges the wait to it
	// (holdRents). 0: a prompt still being computed, not charged.
	rentKey uint64
	at      int64 // Request.Now of the advice
}

// Holding reports whether the advice is to wait.
func (h *HoldAdvice) Holding() bool { return h.Wait > 0 }

// Continues keeps prev's Until when h advises the same wait as prev (the
// same replica and request in the slot): a wait decided again does not
// extend its deadline. It reports whether it did.
func (h *HoldAdvice) Continues(prev HoldAdvice) bool {
	if !prev.Holding() || prev.Replica != h.Replica || prev.Owner != h.Owner {
		return false
	}
	h.Until = min(h.Until, prev.Until)
	return true
}

// Hold records that the request is held on advice h at now: its first
// hold sets HoldSince and HeldFor (that hold's promise); later ones keep
// them, so a request is held at most Config.SlotHold in all and its End
// is judged against what it was first promised.
func (r *Request) Hold(h HoldAdvice, now int64) {
	if r.HoldSince == 0 {
		r.HoldSince, r.HeldFor = now, h.Shared
	}
}

// Decision is a policy's ranked answer. Reused by the caller; Ranked's
// backing array is kept between calls. It also carries the per-caller scratch
// Decide needs (so Decide allocates nothing): use one Decision per goroutine.
type Decision struct {
	Ranked []ReplicaID // best first; the proxy retries down the list
	// CachedTokens[i] is the predicted cached prefix, in tokens, of Ranked[i].
	CachedTokens []int
	Policy       string // name of the policy that decided
	// Hold, when Hold.Holding(): wait for a busy slot instead of beginning
	// on Ranked[0] now (HoldAdvice).
	Hold HoldAdvice

	view View // per-caller scratch for Decide: no allocation once warm
}

// Flight tracks one routed request for load accounting. It is a value: the
// caller keeps it on its stack and passes a pointer back. No allocation.
type Flight struct {
	Replica        ReplicaID
	UncachedTokens int   // predicted prefill tokens not cached on Replica (the index's hit discounted by the replica's confidence)
	PromptTokens   int   // estimated prompt tokens
	Start          int64 // nanoseconds on the caller's clock
	FirstTokenAt   int64 // 0 until FirstToken is called

	predCached int     // the index's predicted cached tokens at Begin, undiscounted
	gen        uint32  // replica generation at Begin (IDs are reused)
	newBlocks  int32   // blocks Begin inserted speculatively
	queued     int64   // replica's pending prefill tokens at Begin
	tail       uint64  // deepest block hash inserted at Begin
	predTTFT   float64 // the replica's TTFT model at Begin, seconds
	slotWait   float64 // predicted wait for a batch slot at Begin, seconds
	riskWait   float64 // the wait a suspected limit would cause at Begin (repHot.riskProbe), seconds
	busy       int32   // requests on the replica at Begin (this one not counted)
	ownBusy    int32   // of those, this router's own (replica.loadStep)
	loadArea   int64   // the replica's load integral at Begin; from End, its growth over the flight (replica.loadStep)
	buffered   bool    // Request.Buffered: no rate sample at FirstToken
	cont       bool    // the replica's held prefix ended at a finished request's tail
	slotSeq    uint64  // the flight's number in the replica's slot model; 0 = none
	heldFor    int32   // Request.HeldFor of a held request, 0 otherwise
	ram        ramUse  // what the slot model expected the engine to load from its RAM cache
	pendSeq    uint64  // the flight's number in the replica's pendQ
	begunAt    int64   // the replica's begun prefill tokens after this one's (replica.begun)
	later      int64   // prefill tokens begun there after this one and before its first token
	prefilled  int64   // the replica's prefilled tokens at this one's first token, its own in (replica.prefilled)
	decoding   bool    // counted in the replica's decoding sums (FirstToken) until End
	tokAt      int64   // the stream's latest Token, 0 before the first
	tokQuiet   bool    // no request there awaited its first token at tokAt
}

// PredictedTTFT is the TTFT, in seconds, the replica's model predicted for
// the request at Begin (affinity/ttft.go); 0 before Begin.
func (f *Flight) PredictedTTFT() float64 { return f.predTTFT }

// BusyAtBegin is how many requests the replica had (this router's and its
// peers', plus other routers' from fresh engine signals) when Begin ran,
// this one not counted.
func (f *Flight) BusyAtBegin() int { return int(f.busy) }

// Policy ranks eligible replicas for a request. Implementations read the
// View (index, load) and must not allocate per call once warm.
type Policy interface {
	Name() string
	Rank(v *View, req *Request, d *Decision)
}

// The Router API (the replica set and Decide in router.go; Begin,
// FirstToken and End in flight.go; snapshots in status.go):
//
//	func NewRouter(cfg Config) (*Router, error)
//	func (r *Router) AddReplica(spec ReplicaSpec) (ReplicaID, error)
//	func (r *Router) UpdateReplica(id ReplicaID, spec ReplicaSpec) error
//	func (r *Router) RemoveReplica(id ReplicaID)           // index entries dropped; in-flight Flights may still End
//	func (r *Router) SetHealthy(id ReplicaID, healthy bool)
//	func (r *Router) SetDraining(id ReplicaID, draining bool)
//	func (r *Router) MarkSignals(id ReplicaID) SignalMark   // before a scrape is sent: EngineSignals.Mark
//	func (r *Router) SetSignals(id ReplicaID, s EngineSignals)
//	func (r *Router) ResetCache(id ReplicaID)              // engine restarted: forget its cached prefixes
//	func (r *Router) Decide(req *Request, d *Decision) error // ErrModelNotFound / ErrNoReplica
//	func (r *Router) Begin(id ReplicaID, req *Request, d *Decision, f *Flight) // speculative index insert, in-flight++
//	func (r *Router) FirstToken(f *Flight, now int64)       // prefill done: pending prefill -= f.UncachedTokens, rate measured
//	func (r *Router) End(f *Flight, now int64, cachedTokens int, ok bool) // cachedTokens<0: unknown; else corrects the index
//	func (r *Router) EndWith(f *Flight, now int64, o Outcome)  // End with the engine's own timings (llama.cpp)
//	func (r *Router) Models() []string                      // union over healthy replicas (allocates; not hot path)
//	func (r *Router) Replicas() []ReplicaStatus             // snapshot for /debug and metrics (allocates)
//	func (r *Router) Lookup(name string) (ReplicaID, bool)
//
// And the prompt side (prompt.go, hash.go):
//
//	func NewParser(cfg HashConfig) *Parser                  // not goroutine-safe; pool it
//	func (p *Parser) ParseChat(body []byte, out *Prompt) error       // /v1/chat/completions
//	func (p *Parser) ParseCompletion(body []byte, out *Prompt) error // /v1/completions
//	func (p *Parser) ParseEmbedding(body []byte, out *Prompt) error  // /v1/embeddings: model only
//	func HashPath() string                                   // "avx512-256" | "avx2-256" | "avx512" | "avx2" | "sse2" | "neon" | "generic" (the path for 256-byte blocks)
//
// Also exported: Config/HashConfig (config.go), View and Load (view.go),
// ReplicaStatus and Stats (status.go), Router.HashConfig, Router.PolicyName
// and Router.PrefillRate (router.go), Router.ContinuationCredit (flight.go),
// PolicyNames, NewPolicy, BeginHook, RemoveHook (policy.go) and the built-in
// policy types (policy_*.go), NewRouterWithPolicy (custom.go), NewCollector
// (metrics.go), Seed, AppendHashes, SessionKey, CPUFeatures (hash.go),
// Prompt.Fill (prompt.go), CacheOracle and Router.SetCacheOracle
// (oracle.go), Promoter, PromoterConfig, Observation, Action (promote.go),
// Entry, ReplicaLoad, ReplicaLoadOf, Change, Reason (rebalance.go).

// Prompt is the routing-relevant part of one request body. Slices point into
// the Parser's scratch buffers and are valid until the Parser's next call.
type Prompt struct {
	Model        []byte
	Stream       bool
	IncludeUsage bool     // stream_options.include_usage
	User         []byte   // OpenAI `user` field, may be empty
	CacheSalt    []byte   // `cache_salt` (vLLM) if present
	Canonical    []byte   // the canonical prompt bytes (system + tools first)
	Hashes       []uint64 // chained block hashes of Canonical, seeded by model+salt
	Tokens       int      // estimated prompt tokens: len(Canonical)/BytesPerToken
	MaxTokens    int      // max_tokens / max_completion_tokens; 0 = absent
}
