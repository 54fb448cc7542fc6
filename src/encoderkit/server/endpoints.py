"""The model endpoints. Each handler checks its input, tokenises it once on the event loop (to count tokens,
enforce the length limit and report usage), queues one item per sequence on its model's batcher, and shapes the
answer; the model runs in the batcher's worker thread through the task pipelines (``encoderkit.tasks``).

The ``RUNNERS`` are what the worker thread runs on a batch of items, one per kind of work.
"""
from __future__ import annotations

import base64
import functools
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from ..errors import InputError
from ..retrieval.base import DENSE_KINDS, search_any
from ..tasks.pipeline import softmax
from ..tasks.rerank import activate, distinct, ranked
from .errors import ApiError, describe_validation_errors
from .registry import ServedModel
from .schemas import (EmbedAllRequest, EmbedRequest, EmbedSparseRequest, FillMaskRequest, NerRequest,
                      OpenAIEmbeddingRequest, PredictRequest, QaRequest,
                      RerankRequest, SearchRequest, TokenizeRequest)
from .state import ClientGone, ServerState, client_gone_response

Body = TypeVar("Body", bound=BaseModel)
router = APIRouter()
MAX_SEARCH_K = 1000


# ---------------------------------------------------------------------------------------------
# What the worker thread runs: a batch of items in, one result per item out
# ---------------------------------------------------------------------------------------------
def _run_embed(model: ServedModel) -> Callable[[list[Any]], Sequence[Any]]:
    embedder = model.pipeline("embed")
    return lambda items: embedder.encode_tokens([ids for ids, _ in items], [types for _, types in items]).numpy()


def _run_classify(model: ServedModel) -> Callable[[list[Any]], Sequence[Any]]:
    classifier = model.pipeline("predict")
    return lambda items: classifier.logits_and_features_of_tokens([i for i, _ in items], [t for _, t in items])[0]


def _run_ner(model: ServedModel) -> Callable[[list[Any]], Sequence[Any]]:
    return model.pipeline("ner")


def _run_qa(model: ServedModel) -> Callable[[list[Any]], Sequence[Any]]:
    answerer = model.pipeline("qa")

    def run(items: list[tuple[str, str]]) -> list[Any]:
        return [answers[0] if answers else None
                for answers in answerer([q for q, _ in items], [c for _, c in items])]

    return run


def _run_fill_mask(model: ServedModel) -> Callable[[list[Any]], Sequence[Any]]:
    fill = model.pipeline("fill-mask")

    def run(items: list[tuple[str, int]]) -> list[Any]:
        results = fill([text for text, _ in items], top_k=max(k for _, k in items))
        return [[predictions[:k] for predictions in per_mask] for per_mask, (_, k) in zip(results, items)]

    return run


def _run_embed_sparse(model: ServedModel) -> Callable[[list[Any]], Sequence[Any]]:
    embedder = model.pipeline("embed_sparse")

    def run(items: list[tuple[list[int], list[int]]]) -> list[Any]:
        vectors = embedder.encode_tokens([ids for ids, _ in items], [types for _, types in items])
        return [vectors.row(r) for r in range(len(vectors))]

    return run


def _run_embed_all(model: ServedModel) -> Callable[[list[Any]], Sequence[Any]]:
    """Token vectors: a multi-vector model's (items are (text, is_query): it tokenises with its markers), or an
    encoder's final states (items are token ids, as /embed's)."""
    pipeline = model.pipeline("embed_all")
    if hasattr(pipeline, "maxsim"):
        def run_multi_vector(items: list[tuple[str, bool]]) -> list[Any]:
            out: list[Any] = [None] * len(items)
            for flag in (True, False):
                rows = [i for i, (_, is_query) in enumerate(items) if is_query is flag]
                if rows:
                    for i, vectors in zip(rows, pipeline.encode([items[i][0] for i in rows], is_query=flag)):
                        out[i] = vectors
            return out

        return run_multi_vector

    def run_states(items: list[tuple[list[int], list[int]]]) -> list[Any]:
        out: list[Any] = [None] * len(items)
        for indices, states, packing in pipeline.engine.run([ids for ids, _ in items], [t for _, t in items]):
            starts = packing.cu_seqlens.tolist()
            for k, i in enumerate(indices.tolist()):
                out[i] = states[starts[k]:starts[k + 1]].float().numpy().copy()
        return out

    return run_states


RUNNERS = {"embed": _run_embed, "classify": _run_classify, "ner": _run_ner, "qa": _run_qa,
           "fill-mask": _run_fill_mask, "embed_sparse": _run_embed_sparse, "embed_all": _run_embed_all}


# ---------------------------------------------------------------------------------------------
# Reading a request
# ---------------------------------------------------------------------------------------------
async def parse(request: Request, schema: type[Body]) -> Body:
    """The body as ``schema``: 400 for a body that is not UTF-8 JSON, 422 naming the field for a wrong value."""
    body = await request.body()
    if not body.strip():
        raise ApiError(400, f"the request body is empty; send a JSON object ({_fields(schema)})")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {exc.start}); send JSON encoded as UTF-8")
    try:
        return schema.model_validate_json(text)
    except ValidationError as exc:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            detail = next(e for e in errors if e.get("type") == "json_invalid").get("ctx", {}).get("error", "")
            raise ApiError(400, f"the request body is not valid JSON ({detail}); send a JSON object "
                                f"({_fields(schema)})")
        raise ApiError(422, describe_validation_errors(errors))


def _fields(schema: type[BaseModel]) -> str:
    return "fields: " + ", ".join(schema.model_fields)


def texts_of(state: ServerState, value: str | list[str], field: str) -> tuple[list[str], bool]:
    """(the texts, whether one text was sent); 422 for none or an empty one, 413 beyond the client batch size."""
    single = isinstance(value, str)
    texts = [value] if single else list(value)
    if not texts:
        raise ApiError(422, f"{field}: the list is empty; send at least one text")
    limit = state.settings.max_client_batch_size
    if len(texts) > limit:
        raise ApiError(413, f"{field}: {len(texts)} inputs in one request; the server takes at most {limit} "
                            "(--max-client-batch-size): split the request")
    for index, text in enumerate(texts):
        if not text:
            raise ApiError(422, f"{_name(field, index, single)}: the text is empty")
    return texts, single


def _name(field: str, index: int, single: bool) -> str:
    return field if single else f"{field}[{index}]"


async def tokenize(state: ServerState, model: ServedModel, texts: Sequence[str], pairs: Sequence[str] | None = None,
                   *, max_length: int | None = None, truncate: bool = False, names: Sequence[str] = (),
                   add_special_tokens: bool = True) -> list[Any]:
    """Encodings (the tokenizers library's) of texts or pairs, made on the server's tokenizer thread (the event loop
    goes on; tokenising overlaps the model's work). One longer than ``max_length`` tokens is cut to it with
    ``truncate``, else it is a 413 that names it (``names[i]``); ``max_length`` None: no limit."""
    def run() -> list[Any]:
        tokenizer = model.tokenizer
        encodings = tokenizer.encode_raw(list(texts), None if pairs is None else list(pairs), truncation=False,
                                         add_special_tokens=add_special_tokens)
        if max_length is None:
            return encodings
        long = [i for i, encoding in enumerate(encodings) if len(encoding.ids) > max_length]
        if long and not truncate:
            first = long[0]
            raise ApiError(413, f"{names[first]} is {len(encodings[first].ids)} tokens long, special tokens "
                                f"included; model {model.name!r} reads at most {max_length}: shorten it, or send "
                                "\"truncate\": true to cut it")
        if long:
            cut = tokenizer.encode_raw([texts[i] for i in long], None if pairs is None else [pairs[i] for i in long],
                                       max_length=max_length)
            for i, encoding in zip(long, cut):
                encodings[i] = encoding
        return encodings

    return await state.tokenizing(run)


async def run_sequences(state: ServerState, request: Request, model: ServedModel, kind: str,
                        encodings: Sequence[Any]) -> list[Any]:
    """The ``kind`` work on tokenised sequences, one batcher item each (costing its tokens): a result each."""
    return await state.run(request, model, kind, [(e.ids, e.type_ids) for e in encodings],
                           [len(e.ids) for e in encodings])


def endpoint(path: str, schema: type[BaseModel], summary: str) -> Callable[[Callable[..., Any]], Any]:
    """Registers ``POST path``, documenting ``schema`` as its JSON body (the handler parses it itself, see
    ``begin``); a client that disconnected before its answer gets none (a 499 in the metrics)."""
    def register(handler: Callable[[Request], Awaitable[Any]]) -> Any:
        @functools.wraps(handler)
        async def answer(request: Request) -> Any:
            try:
                return await handler(request)
            except ClientGone:
                return client_gone_response()

        return router.post(path, summary=summary, openapi_extra={"requestBody": {
            "required": True, "content": {"application/json": {"schema": schema.model_json_schema()}}}})(answer)

    return register


async def begin(request: Request, schema: type[Body], kind: str | None = None
                ) -> tuple[ServerState, Body, ServedModel]:
    """The server's state, the parsed body and the model the body asks for (checked to serve ``kind``)."""
    state: ServerState = request.app.state.server
    body = await parse(request, schema)
    model = state.named(body.model) if kind is None else state.model_for(kind, body.model)
    return state, body, model


# ---------------------------------------------------------------------------------------------
# Embeddings
# ---------------------------------------------------------------------------------------------
async def embed_texts(state: ServerState, request: Request, model: ServedModel, value: str | list[str], field: str,
                      *, truncate: bool, dimensions: int | None, normalize: bool,
                      prompt_name: str | None = None) -> tuple[np.ndarray, int]:
    """(vectors (texts, dim) float32, tokens read) of the request's texts, each after the prompt ``prompt_name``
    names (None: the model's default prompt, if any), as ``Embedder.encode`` puts it."""
    texts, single = texts_of(state, value, field)
    texts = with_prompt(model.pipeline("embed"), texts, prompt_name)
    size = model.config.hidden_size
    if dimensions is not None and not 1 <= dimensions <= size:
        raise ApiError(422, f"dimensions: must be between 1 and {size} (model {model.name!r} gives {size}-dim "
                            f"vectors), found {dimensions}")
    names = [_name(field, i, single) for i in range(len(texts))]
    encodings = await tokenize(state, model, texts, max_length=model.max_length("embed"), truncate=truncate,
                               names=names)
    rows = await run_sequences(state, request, model, "embed", encodings)
    vectors = np.stack(rows).astype(np.float32, copy=False)
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if normalize:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors, sum(len(e.ids) for e in encodings)


@endpoint("/embed", EmbedRequest, "Embed texts (text-embeddings-inference): [[float]]")
async def embed(request: Request) -> JSONResponse:
    state, body, model = await begin(request, EmbedRequest, "embed")
    vectors, _ = await embed_texts(state, request, model, body.inputs, "inputs", truncate=body.truncate,
                                   dimensions=body.dimensions, normalize=body.normalize, prompt_name=body.prompt_name)
    return JSONResponse(vectors.tolist())


MATCHED_TERMS_SHOWN = 20


def _matched_terms(state: ServerState, found: Any, sparse: tuple[str, Any, Any], text: str, rows: list[int]
                   ) -> list[list[dict[str, Any]]]:
    """For each document of ``rows``, the terms the sparse query shares with it (largest contribution first), each
    with its weights, its token, and whether it is an expansion (a term of the query's vector that is not one of
    its own tokens: the query is tokenised once for all the hits)."""
    name, part, query = sparse
    tokenizer = state.registry.get(found.encoders[name]).pipeline("embed_sparse").tokenizer
    own = set(tokenizer.encode_ids([text])[0][0])
    out = []
    for row in rows:
        terms = part.matched_terms(query, row)[:MATCHED_TERMS_SHOWN]
        tokens = tokenizer.convert_ids_to_tokens([term for term, _, _ in terms])
        out.append([{"token": token or str(term), "query_weight": q, "document_weight": d,
                     "expansion": term not in own} for token, (term, q, d) in zip(tokens, terms)])
    return out


def with_prompt(pipeline: Any, texts: list[str], prompt_name: str | None) -> list[str]:
    """The texts after the prompt ``prompt_name`` names (None: the pipeline's default prompt, if any); an unknown
    name is a 422 listing the model's prompts."""
    try:
        prompt = pipeline.prompt_of(None, prompt_name) if hasattr(pipeline, "prompt_of") else None
    except InputError as exc:
        raise ApiError(422, f"prompt_name: {exc}") from None
    if prompt_name is not None and not hasattr(pipeline, "prompt_of"):
        raise ApiError(422, "prompt_name: this model defines no prompts")
    return [prompt + text for text in texts] if prompt else texts


@endpoint("/embed_sparse", EmbedSparseRequest,
          "Sparse (SPLADE) vectors (text-embeddings-inference): [[{index, value}]]")
async def embed_sparse(request: Request) -> JSONResponse:
    state, body, model = await begin(request, EmbedSparseRequest, "embed_sparse")
    texts, single = texts_of(state, body.inputs, "inputs")
    texts = with_prompt(model.pipeline("embed_sparse"), texts, body.prompt_name)
    encodings = await tokenize(state, model, texts, max_length=model.max_length("embed_sparse"),
                               truncate=body.truncate, names=[_name("inputs", i, single) for i in range(len(texts))])
    rows = await run_sequences(state, request, model, "embed_sparse", encodings)
    return JSONResponse([[{"index": int(c), "value": float(v)} for c, v in zip(*row)] for row in rows])


@endpoint("/embed_all", EmbedAllRequest, "Every token's vector (text-embeddings-inference): [[[float]]]")
async def embed_all(request: Request) -> JSONResponse:
    state, body, model = await begin(request, EmbedAllRequest, "embed_all")
    texts, single = texts_of(state, body.inputs, "inputs")
    pipeline = model.pipeline("embed_all")
    texts = with_prompt(pipeline, texts, body.prompt_name)
    names = [_name("inputs", i, single) for i in range(len(texts))]
    if hasattr(pipeline, "maxsim"):  # multi-vector: its own tokenisation (marker, query length), counted here
        try:
            tokens = await state.tokenizing(lambda: pipeline.tokenize(texts, is_query=body.is_query))
        except InputError as exc:
            raise ApiError(422, f"inputs: {exc}") from None
        if tokens.truncated and not body.truncate:
            raise ApiError(413, f"{tokens.truncated} of the inputs are longer than the {tokens.limit} tokens model "
                                f"{model.name!r} reads: shorten them, or send \"truncate\": true to cut them")
        rows = await state.run(request, model, "embed_all", [(text, body.is_query) for text in texts],
                               [len(ids) for ids in tokens.ids])
    else:
        if body.is_query:
            raise ApiError(422, f"is_query: model {model.name!r} is not a multi-vector model; its token states "
                                "do not depend on it")
        encodings = await tokenize(state, model, texts, max_length=model.max_length("embed_all"),
                                   truncate=body.truncate, names=names)
        rows = await run_sequences(state, request, model, "embed_all", encodings)
    return JSONResponse([np.asarray(row, dtype=np.float32).tolist() for row in rows])


@endpoint("/v1/embeddings", OpenAIEmbeddingRequest, "Embed texts (OpenAI's embeddings API)")
async def openai_embeddings(request: Request) -> JSONResponse:
    state, body, model = await begin(request, OpenAIEmbeddingRequest, "embed")
    vectors, tokens = await embed_texts(state, request, model, body.input, "input", truncate=False,
                                        dimensions=body.dimensions, normalize=True)
    if body.encoding_format == "base64":  # little-endian float32, as OpenAI sends it
        encoded: list[Any] = [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in vectors]
    else:
        encoded = vectors.tolist()
    return JSONResponse({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)],
        "model": model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })


# ---------------------------------------------------------------------------------------------
# Cross-encoders and classifiers
# ---------------------------------------------------------------------------------------------
@endpoint("/rerank", RerankRequest, "Rank texts for a query with a cross-encoder, best first")
async def rerank(request: Request) -> JSONResponse:
    state, body, model = await begin(request, RerankRequest, "rerank")
    if not body.query:
        raise ApiError(422, "query: the text is empty")
    texts, _ = texts_of(state, body.texts, "texts")
    unique, inverse, first = distinct(texts)  # a text sent twice is scored once (Reranker.scores does the same)
    encodings = await tokenize(state, model, [body.query] * len(unique), unique, max_length=model.max_length("rerank"),
                               truncate=body.truncate, names=[f"query + texts[{i}]" for i in first])
    logits = await run_sequences(state, request, model, "rerank", encodings)
    scores = activate(np.array([row[0] for row in logits])[inverse], "none" if body.raw_scores else "sigmoid")
    return JSONResponse(ranked(scores, texts, return_text=body.return_text))


def predict_inputs(state: ServerState, value: str | list[str] | list[list[str]]
                   ) -> tuple[list[str], list[str | None], bool]:
    """TEI's reading of "inputs": a text, a pair [text, text], or a batch [[text], [text, text], ...]."""
    if isinstance(value, str) or (value and all(isinstance(v, str) for v in value)):
        single = [value] if isinstance(value, str) else value
        if len(single) not in (1, 2):
            raise ApiError(422, f"inputs: a flat list is one text [text] or one pair [text, text], found "
                                f"{len(single)} strings; send a batch as [[text], [text, text], ...]")
        batch = [single]
        one = True
    else:
        batch = list(value)
        one = False
    if not batch:
        raise ApiError(422, "inputs: the list is empty; send at least one text")
    limit = state.settings.max_client_batch_size
    if len(batch) > limit:
        raise ApiError(413, f"inputs: {len(batch)} inputs in one request; the server takes at most {limit} "
                            "(--max-client-batch-size): split the request")
    texts, pairs = [], []
    for index, sequence in enumerate(batch):
        where = "inputs" if one else f"inputs[{index}]"
        if not isinstance(sequence, list) or len(sequence) not in (1, 2):
            raise ApiError(422, f"{where}: expected [text] or [text, pair], found {len(sequence)} strings")
        if not all(sequence):
            raise ApiError(422, f"{where}: the text is empty")
        texts.append(sequence[0])
        pairs.append(sequence[1] if len(sequence) == 2 else None)
    return texts, pairs, one


@endpoint("/predict", PredictRequest, "Classify texts or pairs: labels with scores, best first")
async def predict(request: Request) -> JSONResponse:
    state, body, model = await begin(request, PredictRequest, "predict")
    texts, pairs, one = predict_inputs(state, body.inputs)
    names = ["inputs" if one else f"inputs[{i}]" for i in range(len(texts))]
    max_length = model.max_length("predict")
    encodings: list[Any] = [None] * len(texts)
    for with_pair in (False, True):  # singles and pairs tokenise apart
        rows = [i for i, pair in enumerate(pairs) if (pair is not None) == with_pair]
        if rows:
            found = await tokenize(state, model, [texts[i] for i in rows],
                                   [pairs[i] for i in rows] if with_pair else None, max_length=max_length,
                                   truncate=body.truncate, names=[names[i] for i in rows])
            for i, encoding in zip(rows, found):
                encodings[i] = encoding
    logits = np.stack(await run_sequences(state, request, model, "predict", encodings))
    labels = model.config.labels
    if body.raw_scores:
        scores = logits
    elif len(labels) == 1 or model.config.problem_type == "multi_label_classification":
        scores = activate(logits, "sigmoid")
    else:
        scores = softmax(logits)
    answers = [sorted(({"label": label, "score": float(s)} for label, s in zip(labels, row)),
                      key=lambda p: -p["score"]) for row in scores]
    return JSONResponse(answers[0] if one else answers)


# ---------------------------------------------------------------------------------------------
# Token classification, question answering, fill-mask
# ---------------------------------------------------------------------------------------------
@endpoint("/ner", NerRequest, "Named entities with character offsets")
async def ner(request: Request) -> JSONResponse:
    state, body, model = await begin(request, NerRequest, "ner")
    texts, single = texts_of(state, body.inputs, "inputs")
    costs = [len(e.ids) for e in await tokenize(state, model, texts)]  # read in windows: no length limit
    found = await state.run(request, model, "ner", texts, costs)
    answers = [[{"label": e.type, "text": e.text, "start": e.start, "end": e.end, "score": e.score} for e in entities]
               for entities in found]
    return JSONResponse(answers[0] if single else answers)


@endpoint("/qa", QaRequest, "The answer span of a question in a context")
async def qa(request: Request) -> JSONResponse:
    state, body, model = await begin(request, QaRequest, "qa")
    for field in ("question", "context"):
        if not getattr(body, field).strip():
            raise ApiError(422, f"{field}: the text is empty")
    cost = len((await tokenize(state, model, [body.question], [body.context]))[0].ids)
    (answer,) = await state.run(request, model, "qa", [(body.question, body.context)], [cost])
    if answer is None:
        return JSONResponse({"answer": "", "start": 0, "end": 0, "score": 0.0})
    return JSONResponse({"answer": answer.text, "start": answer.start, "end": answer.end, "score": answer.score})


@endpoint("/fill-mask", FillMaskRequest, "The most probable tokens for each mask token")
async def fill_mask(request: Request) -> JSONResponse:
    state, body, model = await begin(request, FillMaskRequest, "fill-mask")
    texts, single = texts_of(state, body.inputs, "inputs")
    if not 1 <= body.top_k <= 100:
        raise ApiError(422, f"top_k: must be between 1 and 100, found {body.top_k}")
    mask = model.tokenizer.mask_token
    encodings = await tokenize(state, model, texts, max_length=model.max_length("fill-mask"),
                               names=[_name("inputs", i, single) for i in range(len(texts))])
    for index, encoding in enumerate(encodings):
        if model.tokenizer.mask_token_id not in encoding.ids:
            raise ApiError(422, f"{_name('inputs', index, single)}: the text has no {mask} token to fill")
    found = await state.run(request, model, "fill-mask", [(text, body.top_k) for text in texts],
                            [len(e.ids) for e in encodings])
    answers = []
    for per_mask in found:  # one mask: a list of predictions; several: a list per mask (as transformers answers)
        shaped = [[{"token": p.token_id, "token_str": p.token, "score": p.score, "sequence": p.sequence}
                   for p in predictions] for predictions in per_mask]
        answers.append(shaped[0] if len(shaped) == 1 else shaped)
    return JSONResponse(answers[0] if single else answers)


# ---------------------------------------------------------------------------------------------
# Tokens and search
# ---------------------------------------------------------------------------------------------
@endpoint("/tokenize", TokenizeRequest, "Tokens with ids and character offsets (TEI's shape)")
async def tokenize_route(request: Request) -> JSONResponse:
    state, body, model = await begin(request, TokenizeRequest)
    texts, _ = texts_of(state, body.inputs, "inputs")
    encodings = await tokenize(state, model, texts, add_special_tokens=body.add_special_tokens)
    answer = []
    for text, encoding in zip(texts, encodings):
        tokens = []
        for token_id, token, special, (start, stop) in zip(encoding.ids, encoding.tokens,
                                                           encoding.special_tokens_mask, encoding.offsets):
            if special:
                tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            else:
                tokens.append({"id": token_id, "text": text[start:stop], "special": False, "start": start,
                               "stop": stop})
        answer.append(tokens)
    return JSONResponse(answer)


@endpoint("/search", SearchRequest, "The k nearest indexed texts of a query (needs --index)")
async def search(request: Request) -> JSONResponse:
    state: ServerState = request.app.state.server
    body = await parse(request, SearchRequest)
    found = state.registry.search
    if found is None:
        raise ApiError(404, "this server has no search index; start it with --index DIR (an index saved by "
                            "`encoderkit index`)")
    if not 1 <= body.k <= MAX_SEARCH_K:
        raise ApiError(422, f"k: must be between 1 and {MAX_SEARCH_K}, found {body.k}")
    if not body.query:
        raise ApiError(422, "query: the text is empty")
    if found.index.kind in DENSE_KINDS:
        model = state.model_for("embed", body.model or found.model)
        vectors, _ = await embed_texts(state, request, model, body.query, "query", truncate=True, dimensions=None,
                                       normalize=False)
        if model.config.hidden_size != found.index.dimension:
            raise ApiError(400, f"model {model.name!r} gives {model.config.hidden_size}-dim vectors but the index "
                                f"holds {found.index.dimension}-dim ones; search with {found.model!r}")
        result = await state.in_worker(found.index.search, vectors, body.k)
    else:  # bm25, sparse, multi-vector, hybrid: each part's query from the model the index was matched with
        if body.model is not None:
            raise ApiError(422, f"model: a {found.index.kind} index encodes its queries with the models it was "
                                "built with; leave the field out")
        queries = await state.in_worker(found.encode_query, state.registry, body.query)
        result = await state.in_worker(search_any, found.index, queries, body.k)
    sparse = [(name, part, queries[name] if name else queries) for name, part in found.parts.items()
              if part.kind == "sparse"] if found.index.kind not in DENSE_KINDS else []
    hits = [{"id": found.index.ids[row], "text": found.texts[row] if found.texts else None, "score": float(score)}
            for score, row in zip(result.scores[0], result.indices[0]) if row >= 0]
    if sparse and hits:  # which terms matched: the query's own tokens, and the terms its vector expanded to
        rows = [int(row) for row in result.indices[0] if row >= 0]
        for hit, terms in zip(hits, await state.in_worker(_matched_terms, state, found, sparse[0], body.query,
                                                          rows)):
            hit["terms"] = terms
    return JSONResponse(hits)
