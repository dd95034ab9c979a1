DO $$ DECLARE c record; v text := ''; BEGIN
FOR c IN SELECT conname, pg_get_constraintdef(oid) AS def FROM pg_constraint WHERE conrelid = 'zeroth.runs'::regclass AND contype = 'c' ORDER BY conname LOOP
  v := v || CASE WHEN v = '' THEN '' ELSE ' AND ' END || replace(substr(c.def, 7), ' NOT VALID', '');
  EXECUTE format('ALTER TABLE zeroth.runs DROP CONSTRAINT %I', c.conname);
END LOOP;
EXECUTE 'ALTER TABLE zeroth.runs ADD CONSTRAINT runs_all CHECK (' || v || ')';
END $$;
