// Types of attnd's JavaScript client (index.js), kept by hand beside it;
// tests/js/types/ compiles a use of every call with tsc --strict, and a
// file of misuses that must not compile.

/** A tensor: row-major data and its shape. */
export interface Tensor<D = Float32Array> {
  data: D;
  shape: number[];
}

/** What a float argument may be: a Tensor, or nested arrays of numbers. */
export type FloatInput =
  | Tensor<Float32Array | ArrayLike<number>>
  | number[][]
  | number[][][];

/** A boolean mask (true = hidden): booleans, or a Uint8Array (1 = hidden). */
export type BoolInput = Tensor<Uint8Array | boolean[]> | boolean[] | boolean[][];

/** attnMask: booleans (true = hidden) or numbers added to the scores. */
export type MaskInput = Tensor<Uint8Array | boolean[] | Float32Array | number[]> | boolean[][] | boolean[][][] | number[][] | number[][][];

/** Session rows: (n, E), or one row (E,); never a batch. */
export type RowsInput = Tensor<Float32Array | ArrayLike<number>> | number[][] | Float32Array | number[];

export type AttentionMode = "none" | "mean" | "heads";

/** Options every call takes. */
export interface CallOptions {
  /** Ends the call: it rejects with the signal's reason. */
  signal?: AbortSignal;
  /** This call's deadline (sent as Request-Timeout-Ms on compute routes);
   * the client's timeoutMs otherwise. */
  timeoutMs?: number;
  /** A W3C traceparent to continue; the answer's is Result.traceparent. */
  traceparent?: string;
}

/** SPEC section 9's selection of the attention matrices. */
export interface Selection {
  attention?: AttentionMode;
  attentionHeads?: number[];
  attentionRows?: [number, number];
  attentionTopK?: number;
  attentionDtype?: "float32" | "float16" | "bfloat16";
  /** Further fields of the native body, sent as given (snake_case). */
  fields?: Record<string, unknown>;
}

export interface AttentionOptions extends Selection, CallOptions {
  query: FloatInput;
  key?: FloatInput;
  value?: FloatInput;
  model?: string;
  causal?: boolean;
  keyPaddingMask?: BoolInput;
  attnMask?: MaskInput;
  /** A decoder model's positions. */
  positions?: number[] | Int32Array;
}

/** attentionTopK's answer: the k largest weights of each row and their key indices. */
export interface TopK {
  indices: Tensor<Int32Array>;
  values: Tensor<Float32Array>;
}

export interface Usage {
  batch?: number;
  sequences?: number;
  query_tokens?: number;
  key_tokens?: number;
  queue_us?: number;
  compute_us?: number;
  [key: string]: unknown;
}

export interface Result {
  /** The query's rank: (L, E), or (B, L, E). */
  output: Tensor<Float32Array>;
  /** null unless asked: "mean" (L, S), "heads" (H, L, S), B first for a batch; TopK for attentionTopK. */
  attention: Tensor<Float32Array> | TopK | null;
  usage: Usage;
  model: string | null;
  /** The answer's X-Request-Id (attnd's access log line). */
  requestId: string | null;
  /** The answer's traceparent: the trace id and the request's span id. */
  traceparent: string | null;
}

export interface StepResult extends Result {
  cachedTokens: number;
}

export interface ModelInfo {
  name: string;
  embed_dim: number;
  num_heads: number;
  kdim: number;
  vdim: number;
  causal: boolean;
  [key: string]: unknown;
}

export interface ClientOptions {
  /** Default http://127.0.0.1:8080. */
  url?: string;
  /** Sent as Authorization: Bearer <key>. */
  apiKey?: string | null;
  /** Each call's deadline, default 30000. */
  timeoutMs?: number;
  /** Times a 429 or 503 is sent again after its Retry-After, default 3. */
  retries?: number;
}

export interface SessionOptions extends Selection, CallOptions {
  /** The prefix rows; none opens an empty session. */
  query?: RowsInput;
  model?: string;
  /** The session's id (X-Session-Id): 32 lowercase hex of 128 random bits. */
  id?: string;
}

export interface RestoreOptions extends CallOptions {
  /** Keep this id when it is free; a new one otherwise (Session.id says which). */
  id?: string;
}

export declare class AttndError extends Error {
  constructor(status: number | null, message: string,
    opts?: { retryAfter?: number | null; requestId?: string | null; cause?: unknown });
  /** The HTTP status, or null when no answer came. */
  readonly status: number | null;
  /** Seconds a 429 or 503 asked to wait, else null. */
  readonly retryAfter: number | null;
  readonly requestId: string | null;
}

export declare class Session {
  readonly id: string;
  readonly model: string | null;
  /** Rows in the cache after the last step. */
  readonly cachedTokens: number;
  /** The prefix rows' Result, or null. */
  readonly prefix: Result | null;
  readonly closed: boolean;
  step(rows: RowsInput, opts?: Selection & CallOptions): Promise<StepResult>;
  /** The session's state: a safetensors file's bytes. */
  state(opts?: CallOptions): Promise<Uint8Array>;
  /** Ends the session; twice does nothing, and one that failed leaves it open (close() again). */
  close(opts?: CallOptions): Promise<void>;
}

export declare class Client {
  constructor(opts?: ClientOptions);
  readonly url: string;
  readonly timeoutMs: number;
  readonly retries: number;
  attention(opts: AttentionOptions): Promise<Result>;
  models(opts?: CallOptions): Promise<ModelInfo[]>;
  health(opts?: CallOptions): Promise<{ status: string }>;
  session(opts?: SessionOptions): Promise<Session>;
  restoreSession(bytes: Uint8Array | ArrayBuffer, opts?: RestoreOptions): Promise<Session>;
  /** client.restoreSession on a Client made from the options' url, apiKey, timeoutMs and retries. */
  static restoreSession(bytes: Uint8Array | ArrayBuffer, opts?: RestoreOptions & ClientOptions): Promise<Session>;
}

export declare const version: string;
