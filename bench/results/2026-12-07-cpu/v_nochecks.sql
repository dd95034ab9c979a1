DO $$ DECLARE c record; BEGIN
FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = 'zeroth.runs'::regclass AND contype = 'c' LOOP
  EXECUTE format('ALTER TABLE zeroth.runs DROP CONSTRAINT %I', c.conname);
END LOOP; END $$;
