"""Wire models: the spec's retrieve body and answer, and the amity extension's
knowledge-base and document resources (camelCase, as the Suite's other resources)."""

from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, StringConstraints

from amity.suite.wire import Name, no_nul

MAX_K = 100
Query = Annotated[str, StringConstraints(min_length=1, max_length=10_000), AfterValidator(no_nul)]


class ServerlessKnowledgeRetrievalBody(BaseModel):
    query: Query = Field(description="A text string used to find relevant information within "
                                     "the knowledge-base.")
    k: int = Field(ge=1, le=MAX_K, description="Maximum number of top-ranked knowledge-base "
                                               f"entries to return in results (1 to {MAX_K}).")
    knowledgeIds: list[Name] = Field(min_length=1, max_length=1, description=(
        "A List of knowledge-base IDs. For now, only one knowledge-base is supported."))


class KnowledgeRetrievedChunk(BaseModel):
    text: str = Field(description="Retrieved text matching the search query.")
    score: float = Field(description="Cosine similarity of the query and the chunk "
                                     "(higher is more relevant).")
    contentChunkId: str = Field(description="ID of specific text segment.")
    contentId: str = Field(description="ID of content in knowledge-base.")


class ServerlessKnowledgeRetrievalSuccess(BaseModel):
    results: list[KnowledgeRetrievedChunk]


class CreateKnowledgeRequest(BaseModel):
    name: Name


class KnowledgeInfo(BaseModel):
    id: str
    name: str
    embeddingModel: str | None = Field(description="The model that embedded its documents "
                                                   "(null until the first one).")
    documentCount: int
    chunkCount: int
    createdAt: int


class ListKnowledgeResponse(BaseModel):
    data: list[KnowledgeInfo]


class AddDocumentsRequest(BaseModel):
    fileIds: list[Name] = Field(min_length=1, max_length=100, description=(
        "Files API ids of UPLOADED .txt, .md or .pdf files of the team."))


class DocumentInfo(BaseModel):
    id: str = Field(description="The document's id: retrieve's `contentId` (the file id for a "
                                "document added from the Files API).")
    name: str
    fileId: str | None
    chunkCount: int
    createdAt: int


class ListDocumentsResponse(BaseModel):
    data: list[DocumentInfo]
