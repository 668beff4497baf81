"""Cache schemas the tests share."""

# authors by presence, their books gray under them (the bookstore's, cache/schemas/bookstore.sql,
# without its city and reviewer parts)
AUTHORS_AND_BOOKS = """
CREATE CONTROL TABLE authorlist_pct (authorid INTEGER);
CREATE CACHED VIEW authorcopy AS SELECT * FROM authors PRESENCE ON (authorid) IN authorlist_pct
    REFRESH EVERY 5 MIN;
CREATE CACHED VIEW bookcopy AS SELECT isbn, authorid, title, type, price FROM books
    PRESENCE ON (authorid) IN authorcopy CONSISTENCY ROOT;
"""
