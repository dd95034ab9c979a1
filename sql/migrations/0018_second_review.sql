-- 0018_second_review: state changes for the second outside review's findings (issue 29).
--
-- Each section below names the finding it answers; the functions that use this state are in
-- sql/functions/ and are re-applied after this file in the same upgrade.
SELECT 1;
