"""Knowledge routes.

- `POST /serverless/v1/knowledge/retrieve`, the spec's one knowledge operation: the
  top `k` chunks of one of the team's bases for a query, best first.
- `/beta/knowledge...`, an amity extension (the spec has no ingestion API): create,
  list, get and delete bases; add documents from the Files API or by direct upload
  (`.txt`, `.md`, `.pdf`), list and delete them.
"""

from contextlib import contextmanager

from fastapi import APIRouter, Depends, File, Path, Request, UploadFile
from sqlalchemy.orm import Session

from amity.suite.auth import Caller, caller, db
from amity.suite.errors import ApiError, ErrorBody
from amity.suite.knowledge import bases, ingest, search
from amity.suite.knowledge import schemas as s
from amity.suite.knowledge.embedder import EmbedderError
from amity.suite.knowledge.extract import UnreadableDocument
from amity.suite.knowledge.service import Knowledge
from amity.suite.store.models import KnowledgeBase, KnowledgeDocument, new_id
from amity.suite.tools.base import ToolError
from amity.suite.tools.file_text import MAX_FILE_BYTES
from amity.suite.tools.files import StoreFiles
from amity.suite.wire import Name

router = APIRouter()
KNOWLEDGE_ERRORS = {
    409: {"model": ErrorBody, "description": "The document is in the base already, or the "
                                             "embedding container serves another model."},
    502: {"model": ErrorBody, "description": "The embedding container failed."},
    503: {"model": ErrorBody, "description": "The embedding model is starting (Retry-After) "
                                             "or could not start."},
}
KnowledgeId = Path(description="Knowledge base ID")


def _knowledge(request: Request) -> Knowledge:
    return request.app.state.knowledge


@contextmanager
def _embedding():
    """The embedder's and the document's failures, as the Suite's errors."""
    try:
        yield
    except EmbedderError as error:
        raise ApiError(error.status, str(error), loc=(), type="embedder_error") from None
    except UnreadableDocument as error:
        raise ApiError(422, str(error), loc=("body",), type="unreadable_document") from None


@router.post("/serverless/v1/knowledge/retrieve", tags=["Serverless.Knowledge"],
             response_model=s.ServerlessKnowledgeRetrievalSuccess,
             responses=KNOWLEDGE_ERRORS, summary="Retrieve contexts from chosen knowledge base",
             operation_id="serverlessKnowledgeRetrieve")
def retrieve(request: Request, body: s.ServerlessKnowledgeRetrievalBody,
             who: Caller = Depends(caller)):
    knowledge = _knowledge(request)
    with _embedding():
        hits = search.retrieve(request.app.state.sessions, lambda: knowledge.embedder(request),
                               knowledge.cache, who, body.knowledgeIds[0], body.query, body.k)
    return s.ServerlessKnowledgeRetrievalSuccess(results=[
        s.KnowledgeRetrievedChunk(text=h.text, score=h.score, contentChunkId=h.chunk_id,
                                  contentId=h.document_id) for h in hits])


def _info(session: Session, base: KnowledgeBase) -> s.KnowledgeInfo:
    documents, chunks = bases.counts(session, base)
    return s.KnowledgeInfo(id=base.id, name=base.name, embeddingModel=base.embedding_model,
                           documentCount=documents, chunkCount=chunks, createdAt=base.created_at)


def _document(document: KnowledgeDocument) -> s.DocumentInfo:
    return s.DocumentInfo(id=document.id, name=document.name, fileId=document.file_id,
                          chunkCount=document.chunk_count, createdAt=document.created_at)


@router.post("/beta/knowledge", tags=["Knowledge"], status_code=201, response_model=s.KnowledgeInfo,
             summary="Create a knowledge base (amity extension)", operation_id="create_knowledge")
def create_knowledge(body: s.CreateKnowledgeRequest, who: Caller = Depends(caller),
                     session: Session = Depends(db, scope="function")):
    return _info(session, bases.create_base(session, who, body.name))


@router.get("/beta/knowledge", tags=["Knowledge"], response_model=s.ListKnowledgeResponse,
            summary="List the team's knowledge bases (amity extension)",
            operation_id="list_knowledge")
def list_knowledge(who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    return s.ListKnowledgeResponse(data=[_info(session, b) for b in bases.team_bases(session, who)])


@router.get("/beta/knowledge/{knowledge_id}", tags=["Knowledge"], response_model=s.KnowledgeInfo,
            summary="Get a knowledge base (amity extension)", operation_id="get_knowledge")
def get_knowledge(knowledge_id: Name = KnowledgeId, who: Caller = Depends(caller),
                  session: Session = Depends(db, scope="function")):
    return _info(session, bases.team_base(session, who, knowledge_id))


@router.delete("/beta/knowledge/{knowledge_id}", tags=["Knowledge"], response_model=dict,
               summary="Delete a knowledge base and its documents (amity extension)",
               operation_id="delete_knowledge")
def delete_knowledge(knowledge_id: Name = KnowledgeId, who: Caller = Depends(caller),
                     session: Session = Depends(db, scope="function")):
    session.delete(bases.team_base(session, who, knowledge_id))  # documents, chunks: cascade
    return {}


@router.post("/beta/knowledge/{knowledge_id}/document", tags=["Knowledge"], status_code=201,
             response_model=s.ListDocumentsResponse, responses=KNOWLEDGE_ERRORS,
             summary="Add Files API files to a knowledge base (amity extension)",
             operation_id="add_knowledge_files")
def add_files(request: Request, body: s.AddDocumentsRequest, knowledge_id: Name = KnowledgeId,
              who: Caller = Depends(caller)):
    knowledge, state = _knowledge(request), request.app.state
    if len(set(body.fileIds)) != len(body.fileIds):
        raise ApiError(422, "a file is named twice in `fileIds`", loc=("body", "fileIds"),
                       type="value_error")
    with state.sessions() as session:
        base = bases.team_base(session, who, knowledge_id)
        for file_id in body.fileIds:
            if bases.document_exists(session, base, file_id):
                raise ApiError(409, f"the file {file_id} is in the knowledge base already",
                               loc=("body", "fileIds"), type="conflict")
    files = StoreFiles(state.sessions, state.objects, who, state.config.file_ttl_s)
    documents = []
    for i, file_id in enumerate(body.fileIds):
        try:
            documents.append((file_id, *files.read(file_id, MAX_FILE_BYTES)))
        except ToolError as error:
            status = 404 if error.type == "file_not_found" else 422
            raise ApiError(status, error.msg, loc=("body", "fileIds", i), type=error.type) from None
    with _embedding(), knowledge.embedder(request) as embedder:
        prepared = [ingest.prepare(embedder, knowledge.sizes, file_id, name, data, file_id)
                    for file_id, name, data in documents]
        added = ingest.store(state.sessions, who, knowledge_id, embedder.model, prepared)
    return s.ListDocumentsResponse(data=[_document(d) for d in added])


@router.post("/beta/knowledge/{knowledge_id}/document/upload", tags=["Knowledge"],
             status_code=201, response_model=s.DocumentInfo, responses=KNOWLEDGE_ERRORS,
             summary="Upload a document into a knowledge base (amity extension)",
             operation_id="upload_knowledge_document")
def upload_document(request: Request, knowledge_id: Name = KnowledgeId,
                    file: UploadFile = File(description="A .txt, .md or .pdf file."),
                    who: Caller = Depends(caller)):
    knowledge, state = _knowledge(request), request.app.state
    with state.sessions() as session:
        bases.team_base(session, who, knowledge_id)
    data = file.file.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ApiError(422, f"documents may be at most {MAX_FILE_BYTES} bytes",
                       loc=("body", "file"), type="too_large")
    with _embedding(), knowledge.embedder(request) as embedder:
        prepared = ingest.prepare(embedder, knowledge.sizes, new_id("doc"), file.filename or "", data)
        [document] = ingest.store(state.sessions, who, knowledge_id, embedder.model, [prepared])
    return _document(document)


@router.get("/beta/knowledge/{knowledge_id}/document", tags=["Knowledge"],
            response_model=s.ListDocumentsResponse,
            summary="List a knowledge base's documents (amity extension)",
            operation_id="list_knowledge_documents")
def list_documents(knowledge_id: Name = KnowledgeId, who: Caller = Depends(caller),
                   session: Session = Depends(db, scope="function")):
    base = bases.team_base(session, who, knowledge_id)
    return s.ListDocumentsResponse(data=[_document(d) for d in bases.documents(session, base)])


@router.delete("/beta/knowledge/{knowledge_id}/document/{document_id}", tags=["Knowledge"],
               response_model=dict, summary="Delete a document (amity extension)",
               operation_id="delete_knowledge_document")
def delete_document(knowledge_id: Name = KnowledgeId,
                    document_id: Name = Path(description="Document ID (`contentId`)"),
                    who: Caller = Depends(caller), session: Session = Depends(db, scope="function")):
    bases.delete_document(session, bases.team_base(session, who, knowledge_id), document_id)
    return {}
