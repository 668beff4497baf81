-- The dissertation's Fig 3.2 cache schema over the bookstore (§3.3, §3.6).
-- AuthorCopy: popular authors (presence), consistent per listed city, complete for listed cities.
-- BookCopy: an author's books, gray (consistent with the author's region).
-- ReviewerCopy: popular reviewers. ReviewCopy: reviews of cached books or by cached reviewers,
-- view-level consistent (a circle): it has two presence parents (Rule 3).
CREATE CONTROL TABLE authorlist_pct (authorid INTEGER);
CREATE CONTROL TABLE citylist_csct (city TEXT);
CREATE CONTROL TABLE citylist_cpct (city TEXT);
CREATE CONTROL TABLE reviewerlist_pct (reviewerid INTEGER);

CREATE CACHED VIEW authorcopy AS SELECT * FROM authors
    PRESENCE ON (authorid) IN authorlist_pct
    CONSISTENCY ON (city) IN citylist_csct
    COMPLETENESS ON (city) IN citylist_cpct
    REFRESH EVERY 5 MIN;

CREATE CACHED VIEW bookcopy AS SELECT isbn, authorid, title, type, price FROM books
    PRESENCE ON (authorid) IN authorcopy
    CONSISTENCY ROOT;

CREATE CACHED VIEW reviewercopy AS SELECT * FROM reviewers
    PRESENCE ON (reviewerid) IN reviewerlist_pct
    REFRESH EVERY 10 MIN;

CREATE CACHED VIEW reviewcopy AS SELECT * FROM reviews
    PRESENCE ON (isbn) IN bookcopy
    PRESENCE ON (reviewerid) IN reviewercopy
    CONSISTENCY ON ALL
    REFRESH EVERY 10 MIN;
