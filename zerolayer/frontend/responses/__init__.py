"""OpenAI's Responses API (``/v1/responses``) on the frontend's HTTP app: request items to chat
messages, generation chunks to response objects and stream events, and the stored responses."""
