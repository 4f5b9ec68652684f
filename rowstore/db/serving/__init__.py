"""A partition starting or stopping being served by this node (RFC 0010): leading a replicated
one (promote, demote, fences; the shipping itself is ``rowstore/replication/``) and moving a
one-copy one to another node through objects (release, switch, take)."""
